#include "worker/model/rope.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/torch/layer_ops.h"
#include "kernels/torch/upload.h"

namespace oomb {

at::Tensor RopeInvFreq(const ModelConfig& config, const RopeConfig& r, int64_t rope_seq_len, at::ScalarType master) {
  const auto ft = at::TensorOptions().dtype(master);
  const int64_t dim = config.rope_dim();
  double base = r.theta;
  if (r.type == RopeType::kDynamic) {
    const double max_pos = static_cast<double>(config.max_position_embeddings);
    const double seq_len = std::max<double>(static_cast<double>(rope_seq_len), max_pos);
    base = base * std::pow(r.factor * seq_len / max_pos - (r.factor - 1), static_cast<double>(dim) / (dim - 2));
  }
  const at::Tensor exponents = at::arange(0, dim, 2, at::kLong).to(ft.dtype_opt()->toScalarType()) / dim;
  const at::Tensor pos_freqs = at::pow(base, exponents);
  at::Tensor inv_freq = 1.0 / pos_freqs;
  if (r.type == RopeType::kLongrope) {
    const std::vector<double>& ext = rope_seq_len > r.original_max_position_embeddings ? r.long_factor : r.short_factor;
    inv_freq = 1.0 / (at::tensor(ext, at::kDouble).to(inv_freq.scalar_type()) * pos_freqs);
  } else if (r.type == RopeType::kLinear) {
    inv_freq = inv_freq / r.factor;
  } else if (r.type == RopeType::kLlama3) {
    const double old_ctx = static_cast<double>(r.original_max_position_embeddings);
    const double low_wavelen = old_ctx / r.low_freq_factor, high_wavelen = old_ctx / r.high_freq_factor;
    const at::Tensor wavelen = 2 * M_PI / inv_freq;
    at::Tensor scaled = at::where(wavelen > low_wavelen, inv_freq / r.factor, inv_freq);
    const at::Tensor smooth = (old_ctx / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
    const at::Tensor smoothed = (1 - smooth) * scaled / r.factor + smooth * scaled;
    const at::Tensor medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen);
    inv_freq = at::where(medium, smoothed, scaled);
  } else if (r.type == RopeType::kYarn) {
    auto correction_dim = [&](double rotations) {
      return (dim * std::log(static_cast<double>(r.original_max_position_embeddings) / (rotations * 2 * M_PI))) /
             (2 * std::log(base));
    };
    double low = correction_dim(r.beta_fast), high = correction_dim(r.beta_slow);
    if (r.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(dim - 1));
    if (low == high) high += 0.001;
    const at::Tensor ramp = ((at::arange(dim / 2, at::kFloat).to(*ft.dtype_opt()) - low) / (high - low)).clamp(0, 1);
    const at::Tensor extrapolation_factor = 1 - ramp;
    const at::Tensor interpolation = 1.0 / (r.factor * pos_freqs);
    inv_freq = interpolation * (1 - extrapolation_factor) + inv_freq * extrapolation_factor;
  }
  return inv_freq;
}

std::pair<at::Tensor, at::Tensor> RopeTables(const ModelConfig& config, const RopeConfig& r,
                                             const at::Tensor& positions, int64_t rope_seq_len, at::ScalarType dtype) {
  double attention_factor = r.type == RopeType::kLongrope ? r.attention_factor : 1.0;
  if (r.type == RopeType::kYarn) {
    auto mscale = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
    attention_factor = r.attention_factor > 0 ? r.attention_factor
                       : (r.mscale > 0 && r.mscale_all_dim > 0)
                           ? mscale(r.factor, r.mscale) / mscale(r.factor, r.mscale_all_dim)
                           : mscale(r.factor, 1.0);
  }
  const at::Tensor inv_freq =
      kernels::Upload(RopeInvFreq(config, r, rope_seq_len, dtype == at::kDouble ? at::kDouble : at::kFloat),
                      positions.device());  // no wait
  const at::Tensor freqs = positions.to(inv_freq.scalar_type()).unsqueeze(1) * inv_freq.unsqueeze(0);
  const at::Tensor emb = at::cat({freqs, freqs}, -1);
  return {(emb.cos() * attention_factor).to(dtype), (emb.sin() * attention_factor).to(dtype)};
}

at::Tensor RotateHeads(const ModelConfig& config, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t rotary = config.rope_dim(), D = config.head_dim;
  if (rotary == D) return kernels::ApplyRope(x, cos, sin);
  return at::cat({kernels::ApplyRope(x.narrow(-1, 0, rotary), cos, sin), x.narrow(-1, rotary, D - rotary)}, -1);
}

}  // namespace oomb
