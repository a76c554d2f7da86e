/*
 * libddpfleet_jpeg: decode only the region of a JPEG that a training crop needs, at a DCT
 * scale (1/1, 1/2, 1/4, 1/8), with libjpeg-turbo's partial decoding. trainer/jpeg.py calls it
 * through ctypes; without this library the trainer decodes whole files (torchvision / PIL).
 *
 * For a random-resized crop of a ~500 px photo to 224 px, a whole-file decode spends most of
 * its time on pixels the crop throws away. Here:
 *   - rows above the region are skipped (jpeg_skip_scanlines: entropy-decoded, no IDCT,
 *     upsampling or colour conversion), rows below it are never decoded (we abort there);
 *   - columns outside it are not reconstructed (jpeg_crop_scanline; the region grows to
 *     the iMCU boundary on its left, so the caller gets its real left edge back);
 *   - where the crop is at least twice the output size, the IDCT itself scales down.
 *
 * Errors never exit the process: libjpeg's error_exit longjmps back here, and any warning
 * (corrupt or truncated data) also fails the call, so the caller can fall back to the
 * whole-file decoders and their judgement of bad files. Build (the image's jpeg stage, or
 * `make venv` for the host's tests):
 *   cc -O2 -fPIC -shared -o libddpfleet_jpeg.so jpegcrop.c -ljpeg
 */
#include <setjmp.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <jpeglib.h>

#define DDPFLEET_JPEG_API __attribute__((visibility("default")))
#define EDGE_COLUMNS 8

struct guard {
  struct jpeg_error_mgr pub;
  jmp_buf jump;
  char *message;
  int message_len;
};

static void keep_message(j_common_ptr cinfo) {
  struct guard *g = (struct guard *)cinfo->err;
  char text[JMSG_LENGTH_MAX];
  (*cinfo->err->format_message)(cinfo, text);
  if (g->message != NULL && g->message_len > 0) {
    snprintf(g->message, (size_t)g->message_len, "%s", text);
  }
}

static void fail(j_common_ptr cinfo) {
  keep_message(cinfo);
  longjmp(((struct guard *)cinfo->err)->jump, 1);
}

/* level < 0 is a warning about the data (e.g. "premature end of data segment"): treat it
 * as a failure too. Trace messages (level >= 0) are ignored. */
static void on_message(j_common_ptr cinfo, int level) {
  if (level < 0) {
    fail(cinfo);
  }
}

static void guard_init(struct jpeg_decompress_struct *cinfo, struct guard *g, char *message,
                       int message_len) {
  cinfo->err = jpeg_std_error(&g->pub);
  g->pub.error_exit = fail;
  g->pub.emit_message = on_message;
  g->message = message;
  g->message_len = message_len;
  if (message != NULL && message_len > 0) {
    message[0] = '\0';
  }
}

static int colour_supported(const struct jpeg_decompress_struct *cinfo) {
  /* libjpeg converts these to RGB itself; CMYK/YCCK files go to the fallback (PIL). */
  return cinfo->jpeg_color_space == JCS_YCbCr || cinfo->jpeg_color_space == JCS_GRAYSCALE ||
         cinfo->jpeg_color_space == JCS_RGB;
}

/* Width and height from the header. Returns 0, or -1 with a message. */
DDPFLEET_JPEG_API int ddpfleet_jpeg_size(const unsigned char *data, unsigned long size,
                                         int *width, int *height, char *message,
                                         int message_len) {
  struct jpeg_decompress_struct cinfo;
  struct guard g;
  guard_init(&cinfo, &g, message, message_len);
  jpeg_create_decompress(&cinfo);
  if (setjmp(g.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return -1;
  }
  jpeg_mem_src(&cinfo, data, size);
  jpeg_read_header(&cinfo, TRUE);
  *width = (int)cinfo.image_width;
  *height = (int)cinfo.image_height;
  jpeg_destroy_decompress(&cinfo);
  return 0;
}

/*
 * Decode rows [top, bottom) and at least columns [left, right) of the image scaled by
 * 1/scale_denom (scale_denom 1, 2, 4 or 8; coordinates in scaled pixels, as RGB, 3 bytes per
 * pixel, rows packed) into out (capacity bytes: at least (bottom - top) rows of the scaled
 * image's whole width). On success returns 0 with *out_left (<= left) and *out_width
 * (>= right - *out_left): the columns the rows hold. Returns -1 with a message
 * on any error or warning, -2 if the file is not YCbCr, RGB or greyscale, -3 if the region is
 * empty or outside the scaled image, -4 if out is too small.
 */
DDPFLEET_JPEG_API int ddpfleet_jpeg_decode_region(const unsigned char *data,
                                                  unsigned long size, int scale_denom, int left,
                                                  int top, int right, int bottom,
                                                  unsigned char *out, unsigned long capacity,
                                                  int *out_left, int *out_width, char *message,
                                                  int message_len) {
  struct jpeg_decompress_struct cinfo;
  struct guard g;
  guard_init(&cinfo, &g, message, message_len);
  jpeg_create_decompress(&cinfo);
  if (setjmp(g.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return -1;
  }
  jpeg_mem_src(&cinfo, data, size);
  jpeg_read_header(&cinfo, TRUE);
  if (!colour_supported(&cinfo)) {
    jpeg_destroy_decompress(&cinfo);
    return -2;
  }
  cinfo.out_color_space = JCS_RGB;
  cinfo.scale_num = 1;
  cinfo.scale_denom = (unsigned int)scale_denom;
  jpeg_start_decompress(&cinfo);
  if (left < 0 || top < 0 || right <= left || bottom <= top ||
      (JDIMENSION)right > cinfo.output_width || (JDIMENSION)bottom > cinfo.output_height) {
    jpeg_destroy_decompress(&cinfo);
    return -3;
  }
  /* A few columns either side of the region where the image has them: chroma upsampling of
   * the region's first and last columns then has its neighbours, as in a whole decode. */
  JDIMENSION x = (JDIMENSION)(left > EDGE_COLUMNS ? left - EDGE_COLUMNS : 0);
  JDIMENSION end = (JDIMENSION)right + EDGE_COLUMNS;
  JDIMENSION w = (end < cinfo.output_width ? end : cinfo.output_width) - x;
  if (x > 0 || w < cinfo.output_width) {
    jpeg_crop_scanline(&cinfo, &x, &w);
  }
  size_t stride = (size_t)w * 3;
  if ((size_t)(bottom - top) * stride > capacity) {
    jpeg_destroy_decompress(&cinfo);
    return -4;
  }
  if (top > 0) {
    jpeg_skip_scanlines(&cinfo, (JDIMENSION)top);
  }
  while (cinfo.output_scanline < (JDIMENSION)bottom) {
    JSAMPROW row = out + (size_t)(cinfo.output_scanline - (JDIMENSION)top) * stride;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  /* The rows below the region are not needed: stop without decoding them. */
  jpeg_abort_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  *out_left = (int)x;
  *out_width = (int)w;
  return 0;
}
