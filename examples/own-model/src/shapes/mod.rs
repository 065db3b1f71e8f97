//! Segmentation: generated images of a rectangle and a disc on noise, with their masks
//! (`own_model.data.Shapes`), and a small U-Net (`own_model.models.UNet`) that labels every pixel;
//! trained with torch's per-pixel cross-entropy and measured by mean IoU and Dice (`experiment=shapes`).

mod masks;
mod unet;
