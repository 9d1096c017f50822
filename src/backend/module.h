/*
 * module.h — finding and opening turbine's own shared modules (the CUDA
 * backend, libturbine_cuda.so) at run time.
 *
 * Search order: $TURBINE_MODULE_DIR when it is set (then only there: a
 * packager or a test can point it at one folder and know nothing else is
 * picked up); otherwise the folder of the running executable
 * (/proc/self/exe: a build tree, or a tarball unpacked anywhere), then
 * <that folder>/../TB_MODULE_REL_DIR (an installed tree moved to another
 * prefix, e.g. with cmake --install --prefix), then TB_MODULE_INSTALL_DIR
 * (the install folder this build was configured with).
 */
#ifndef TB_MODULE_H
#define TB_MODULE_H

#include "core/core.h"

/* Opens the module `file` with dlopen (RTLD_NOW | RTLD_LOCAL) from the first
 * folder of the search order that has it; path (cap bytes) receives where it
 * was found. `what` names it in errors ("CUDA backend"): not found (the
 * folders searched are listed) is TB_ERR_NOT_FOUND; found but not loadable
 * (a library it needs is missing: the loader's message names it) is
 * TB_ERR_UNSUPPORTED. The handle is never closed by turbine. */
tb_status tb_module_open(const char *file, const char *what, void **handle, char *path, size_t cap);

#endif /* TB_MODULE_H */
