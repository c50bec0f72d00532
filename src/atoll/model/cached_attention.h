// Attention against the decode cache (model/decoder.h): a prefill block's queries, each against
// every cached key up to its own position (Decoder::prefill), and one decoded token's queries
// against every cached key (Decoder::step). One process holds every position (row t); under
// tree attention (Zyphra, arXiv 2408.04093) rank r holds position t at row t / P when
// t mod P = r (CacheShard), attends to its rows, and the ranks merge their partial results (each
// query row's max m, normaliser l and unnormalised output o) by the log-sum-exp rule:
// M = max m, L = sum l e^(m-M), O = sum o e^(m-M), out = O / L.
#pragma once

#include "atoll/model/attention_core.h"

namespace atl {

// The rows of k[n, KVD], v[n, KVD] (positions [pos, pos + n)) that `shard` holds, copied into
// its cache rows of k_cache, v_cache [rows, KVD].
template <typename T>
void cache_block(T* k_cache, T* v_cache, const T* k, const T* v, int n, int pos, int KVD, const CacheShard& shard);

// out[n, NH, HD] (=) for the queries q[n, NH, HD] at positions [pos, pos + n) against the cached
// keys and values k_cache, v_cache [rows, NKV·HD] (the block's own included: cache_block first);
// scale 1/sqrt(HD). Queries go in tiles of 64 rows of one head against key chunks, each a BLAS
// product, merged by the online softmax (flash attention's running max and sum per row), as
// model/ring_attention.cc's blocks. With a group (of shard.P ranks, fp32 only) every rank calls
// it together and gets the same out: one all-reduce of the maxima, one of [l | o].
template <typename T>
void attend_prefix(T* out, const T* q, const T* k_cache, const T* v_cache, int n, int pos, int NH, int NKV, int HD,
                   const CacheShard& shard, Collective* group);

// Decoding: out[NH, HD] (=) one token's queries q[NH, HD] against every one of the `rows` cached
// keys and values k_cache, v_cache [rows, NKV·HD] (its own included). The rows are cut into
// splits of 2048 (flash decoding); a task is one key/value head and one split, its query heads
// the rows of one BLAS tile (they read the same keys), and the splits' partial results merge in
// split order, so the bits do not depend on the thread count. With a group (tree attention,
// fp32 only) `rows` are this rank's shard, and every rank sends its (m, l, o) per head to every
// other at once (one message's latency), merged in rank order: every rank ends with the same
// bits.
template <typename T>
void attend_token(T* out, const T* q, const T* k_cache, const T* v_cache, int rows, int NH, int NKV, int HD,
                  Collective* group);

// Decoding's attention of one token (at position pos, its key and value cached already), on one
// process or over the shards of PartContext::cp.
template <typename T>
void attend_cached_any(T* out, const T* q, const T* k_cache, const T* v_cache, int pos, int NH, int NKV, int HD,
                       const PartContext<T>& c) {
  attend_token(out, q, k_cache, v_cache, CacheShard::of(c).rows(pos + 1), NH, NKV, HD, c.cp);
}

}  // namespace atl
