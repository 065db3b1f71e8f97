pub struct MedianPruner;
