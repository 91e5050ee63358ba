// CPU implementation of kernels/page_copy.h: the same contract, on host memory. It is the
// oracle of the CUDA kernels' tests and the CPU path of the trainer.
#ifndef OOMB_KERNELS_REFERENCE_PAGE_COPY_REF_H_
#define OOMB_KERNELS_REFERENCE_PAGE_COPY_REF_H_

#include "kernels/page_copy.h"

namespace oomb::kernels::reference {

void PageGather(const PageCopyParams& p);
void PageScatter(const PageCopyParams& p);
// arena[slots] += k, v for float32 (elem_bytes 4) or float64 (elem_bytes 8) elements.
void PageScatterAdd(const PageCopyParams& p);

}  // namespace oomb::kernels::reference

#endif  // OOMB_KERNELS_REFERENCE_PAGE_COPY_REF_H_
