// Device buffers of DeviceModel (private to device_model.cu), as model/model_buffers.h for
// Model<T>: the flat parameters and gradients, the residual stream, the blocks (each part
// carves what it keeps for its backward pass, model/device_part.cuh), the buffers the blocks
// share, and the head's and the loss's. Every buffer is carved from one arena: carve() runs
// once to count the bytes and once to hand them out, so the two can never disagree.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "atoll/backend/cuda/embedding.h"
#include "atoll/backend/cuda/moe_dispatch.h"
#include "atoll/model/device_block.cuh"
#include "atoll/model/layout.h"
#include "atoll/model/model_config.h"

namespace atl::gpu {

struct DeviceBuffers {
  float *params, *grads;   // [layout.total()]
  std::vector<float*> x;   // [L+1][N,C] residual stream entering each block (x[L]: final norm input)
  std::unique_ptr<DeviceResidualMerge> input_merge;  // after the embedding (residual scaling; else nothing)
  DeviceBlockBuffers blk;  // hn, tmp, dx, dh, dtopk_w: shared by the blocks and the head
  DevicePartScratch scratch;     // each part kind's scratch, shared by its layers
  std::vector<std::unique_ptr<DeviceBlock>> blocks;  // [L]
  float* rstdf;                // final norm [N] (its output goes to blk.tmp)
  float *logits, *ce_lse;      // one head chunk: [head_rows,V], [head_rows]
  float* ce_loss;              // [N] cross-entropy of each position
  int32_t *tokens, *targets;   // [N]
  int32_t* ids_scratch;        // routing and the sorted embedding backward
  double* losses;              // [L,2] aux and z of each layer
  double* choice_counts;       // [L,E] slots each expert took (topk layers) since zero_grads
  // bf16 products only (null in fp32): the parameters rounded once per forward, and the
  // rounded copies of the products' activation inputs (everything else stays fp32).
  uint16_t* w16;               // [layout.total()]
  uint16_t *in16, *dout16;     // [N, max(C,QD,KVD)] a product's input; its d(output)
  uint16_t* logits16;          // [head_rows,V] one head chunk's d(logits)
};

// Takes every buffer for `sizes` (up to max_batch sequences, max_tokens tokens) from `c` (see
// Carver) and builds the blocks (throws ConfigError for an unknown part kind); the bf16 copies
// only when sizes.bf16 (train.precision = bf16). `d` must stay where it is afterwards (the blocks
// point into d.blk).
inline void carve(DeviceBuffers& d, const ModelConfig& m, const ParamLayout& layout, const DevicePartSizes& sizes,
                  int head_rows, Carver& c) {
  const size_t N = size_t(sizes.max_tokens), C = m.dim, K = m.top_k, total = layout.total();
  const bool bf16 = sizes.bf16;
  const size_t QD = size_t(m.n_heads) * m.head_dim, KVD = size_t(m.n_kv_heads) * m.head_dim;
  d.params = c.take<float>(total);
  d.grads = c.take<float>(total);
  d.x.assign(m.n_layers + 1, nullptr);
  for (auto& x : d.x) x = c.take<float>(N * C);
  d.blk = DeviceBlockBuffers(m, int(N), c);
  d.input_merge = std::make_unique<DeviceResidualMerge>(m, layout, "input", false, sizes, c);
  d.blocks.clear();
  for (int l = 0; l < m.n_layers; ++l)
    d.blocks.push_back(std::make_unique<DeviceBlock>(m, layout, l, sizes, d.scratch, d.blk, c));
  for (int l = 1; l < m.n_layers; ++l) d.blocks[l]->link_previous(*d.blocks[l - 1]);  // depth averaging
  d.rstdf = c.take<float>(N);
  d.logits = c.take<float>(size_t(head_rows) * m.vocab_size), d.ce_lse = c.take<float>(head_rows);
  d.ce_loss = c.take<float>(N);
  if (bf16) {
    d.w16 = c.take<uint16_t>(total);
    d.in16 = c.take<uint16_t>(N * std::max({C, QD, KVD})), d.dout16 = c.take<uint16_t>(N * std::max({C, QD, KVD}));
    d.logits16 = c.take<uint16_t>(size_t(head_rows) * m.vocab_size);
  } else {
    d.w16 = d.in16 = d.dout16 = d.logits16 = nullptr;
  }
  d.tokens = c.take<int32_t>(N), d.targets = c.take<int32_t>(N);
  d.ids_scratch = c.take<int32_t>(
      size_t(std::max(routing_scratch_ints(int(N), int(K)), embedding_scratch_ints(int(N)))));
  d.losses = c.take<double>(2 * size_t(m.n_layers));
  d.choice_counts = c.take<double>(size_t(m.n_layers) * m.n_experts);
}

}  // namespace atl::gpu
