/* The rotary table (fsdp_model_rope_table in model.h): cos and sin of every position times every
 * frequency, with the frequencies transformers computes for rope_theta and its linear and llama3
 * scalings. */
#include <math.h>

#include "model.h"

static const double PI = 3.14159265358979323846;

void fsdp_model_rope_table(const fsdp_model_config *cfg, int T, float *out) {
    int half = cfg->head_dim / 2;
    for (int i = 0; i < half; i++) {
        /* inv_freq as transformers computes it; linear scaling divides it by `factor`; the llama3
         * rule slows long wavelengths by `factor`, keeps short ones, and blends the band between. */
        double inv_freq = 1.0 / pow((double)cfg->rope_theta, (2.0 * i) / cfg->head_dim);
        if (cfg->rope_type == FSDP_ROPE_LINEAR) inv_freq /= cfg->rope_factor;
        if (cfg->rope_type == FSDP_ROPE_LLAMA3) {
            double factor = cfg->rope_factor, lo = cfg->rope_low_freq_factor, hi = cfg->rope_high_freq_factor;
            double old_ctx = cfg->rope_original_max_position;
            double low_freq_wavelen = old_ctx / lo, high_freq_wavelen = old_ctx / hi;
            double wavelen = 2.0 * PI / inv_freq;
            if (wavelen > low_freq_wavelen) {
                inv_freq = inv_freq / factor;
            } else if (wavelen >= high_freq_wavelen) {
                double smooth = (old_ctx / wavelen - lo) / (hi - lo);
                inv_freq = (1.0 - smooth) * inv_freq / factor + smooth * inv_freq;
            }
        }
        for (int t = 0; t < T; t++) {
            double angle = (double)t * inv_freq;
            out[((size_t)t * half + i) * 2 + 0] = (float)cos(angle);
            out[((size_t)t * half + i) * 2 + 1] = (float)sin(angle);
        }
    }
}
