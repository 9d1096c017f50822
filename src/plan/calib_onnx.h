/*
 * calib_onnx.h — calibration of INT8 ONNX engines (`turbine build
 * model.onnx --dtype int8 --calib-data DIR`): the calibration inputs, the
 * run of the f32 graph over them on the CPU with a node observer collecting
 * a histogram of |x| for every activation the INT8 pass quantizes
 * (opt/nn_quant.c: the input of each Conv / Gemm / MatMul with a constant
 * weight), and the table of thresholds (tune/calib.h's calibrators and
 * cache file, keyed by the ONNX file's fingerprint).
 *
 * Calibration data (DIR), one sample per set of graph inputs:
 *   - ONNX's backend-test layout: DIR/test_data_set_N/input_K.pb (K the
 *     graph input's position), N = 0, 1, ...; or DIR/input_K.pb (one sample);
 *   - NumPy arrays: DIR/NAME_N.npy (NAME the graph input's name) or
 *     DIR/input_K_N.npy, N = 0, 1, ...; little-endian f32, f64, int64 or
 *     int32, C order, converted to the input's dtype.
 */
#ifndef TB_PLAN_CALIB_ONNX_H
#define TB_PLAN_CALIB_ONNX_H

#include "opt/opt.h"
#include "tune/calib.h"

#define TB_CALIB_ONNX_MAX_SAMPLES 4096
#define TB_NPY_MAX_BYTES ((uint64_t)1 << 32) /* one .npy array at most */

/* Reads sample `k` of dir into in[0, g->n_inputs) (data malloc'd; free
 * each in[i].data). *got = 0 (and nothing allocated) when there is no
 * sample k. */
tb_status tb_calib_onnx_sample(const tb_graph *g, const char *dir, int k, tb_view *in, int *got);

/* Parses a .npy file into t (data malloc'd), converted to dtype `want`
 * (f32, i64 or i32); NumPy's format versions 1 to 3. */
tb_status tb_npy_read(const char *path, tb_dtype want, tb_tensor *t);

/* XXH3 over the ONNX file's bytes: calibration caches are keyed by it. */
tb_status tb_onnx_fingerprint(const char *model_path, uint64_t *out);

/* The thresholds of the activations of g (an f32 graph after the pipeline;
 * taken: freed here) that the INT8 pass quantizes (q: its overrides), over
 * at most max_samples samples of dir on n_threads CPU threads. Entries are named after the
 * values; an activation never negative gets the suffix "/u8" (quantized
 * with zero point 0 over [0, T] instead of [-T, T]). *n_samples: run. */
tb_status tb_calib_onnx_run(tb_graph *g, const char *dir, const tb_calibrator *c, const tb_nn_quant_options *q,
                            int max_samples, int n_threads, uint64_t fingerprint, tb_calib_table **out,
                            int *n_samples);

/* The activation scales of the INT8 pass from a table (acts: a malloc'd
 * array). Threshold T: scale T / 127, zero point 128;
 * "/u8" entries: T / 255, zero point 0. */
tb_status tb_calib_onnx_acts(const tb_calib_table *t, tb_nn_act_quant **acts, int *n);

#endif /* TB_PLAN_CALIB_ONNX_H */
