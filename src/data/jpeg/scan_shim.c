/* What trainyard's entropy decoder (src/data/jpeg/entropy.rs) needs from libjpeg's decompressor, whose
 * fields the Rust binding keeps private: the layout of the one scan that jpeg_start_decompress has begun,
 * and the hook to decode its MCUs. Compiled against the headers mozjpeg-sys built libjpeg with. */
#define JPEG_INTERNALS
#include <stddef.h>
#include <stdio.h>
#include "jpeglib.h"
#include "jpegcomp.h" /* the field names for this build's ABI (_DCT_scaled_size) */

/* entropy.rs's ScanInfo declares these sizes. */
_Static_assert(D_MAX_BLOCKS_IN_MCU == 10 && MAX_COMPS_IN_SCAN == 4, "ScanInfo's array sizes");

typedef struct {
  int blocks_in_mcu;
  int membership[D_MAX_BLOCKS_IN_MCU]; /* the scan component each block of an MCU belongs to */
  int coefficients_needed[D_MAX_BLOCKS_IN_MCU]; /* 0: none, 1: DC only, 64: all (as jdhuff.c decides) */
  int comps_in_scan;
  unsigned restart_interval;
  const JHUFF_TBL *dc[MAX_COMPS_IN_SCAN];
  const JHUFF_TBL *ac[MAX_COMPS_IN_SCAN];
} trainyard_scan;

/* Fills `scan` when the image is one sequential, Huffman-coded, 8-bit scan holding every component (what
 * cameras and encoders write by default) and returns 1; returns 0 for anything else, which libjpeg's own
 * decoder keeps. */
int trainyard_scan_info(j_decompress_ptr cinfo, trainyard_scan *scan) {
  int ci, blkn;
  if (cinfo->progressive_mode || cinfo->arith_code || cinfo->data_precision != 8 ||
      cinfo->buffered_image || cinfo->inputctl->has_multiple_scans ||
      cinfo->comps_in_scan != cinfo->num_components || cinfo->comps_in_scan > MAX_COMPS_IN_SCAN ||
      cinfo->blocks_in_MCU > D_MAX_BLOCKS_IN_MCU || cinfo->Ss != 0 || cinfo->Se != DCTSIZE2 - 1 ||
      cinfo->Ah != 0 || cinfo->Al != 0)
    return 0;
  scan->blocks_in_mcu = cinfo->blocks_in_MCU;
  scan->comps_in_scan = cinfo->comps_in_scan;
  scan->restart_interval = cinfo->restart_interval;
  for (ci = 0; ci < cinfo->comps_in_scan; ci++) {
    jpeg_component_info *compptr = cinfo->cur_comp_info[ci];
    scan->dc[ci] = cinfo->dc_huff_tbl_ptrs[compptr->dc_tbl_no];
    scan->ac[ci] = cinfo->ac_huff_tbl_ptrs[compptr->ac_tbl_no];
    if (scan->dc[ci] == NULL || scan->ac[ci] == NULL)
      return 0;
  }
  for (blkn = 0; blkn < cinfo->blocks_in_MCU; blkn++) {
    jpeg_component_info *compptr = cinfo->cur_comp_info[cinfo->MCU_membership[blkn]];
    scan->membership[blkn] = cinfo->MCU_membership[blkn];
    scan->coefficients_needed[blkn] =
      !compptr->component_needed ? 0 : (compptr->_DCT_scaled_size > 1 ? DCTSIZE2 : 1);
  }
  return 1;
}

/* Hands the scan's MCUs to `decode` in place of libjpeg's Huffman decoder. */
void trainyard_set_decode_mcu(j_decompress_ptr cinfo,
                              boolean (*decode)(j_decompress_ptr cinfo, JBLOCKROW *MCU_data)) {
  cinfo->entropy->decode_mcu = decode;
}
