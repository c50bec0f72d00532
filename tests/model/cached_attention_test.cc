// Decoding's attention of one token against the cache (model/cached_attention.h attend_token)
// against the plain softmax written out here: in fp32 within 1e-5 of the largest output, in fp64
// within 1e-12; contexts below, at and past a split of 2048 keys, GQA groups of 1, 2 and 3 query
// heads. Its bits do not depend on the thread count. Under a group (tree attention over
// ThreadGroup's ranks, the cache sharded as the decoder shards it: position t on rank t mod P)
// every rank ends with the same bits, within 1e-5 of one process (fp32 sums of up to 6000 terms
// in another order) and of the fp64 softmax, also when a rank holds no row.
#include "atoll/model/cached_attention.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/thread_group.h"

namespace atl {
namespace {

struct Shape {
  int NH, NKV, HD;
};

struct Case {
  Shape s;
  int rows;
  std::vector<double> q, k, v;  // [NH, HD], [rows, NKV·HD] x2
};

Case make_case(Shape s, int rows, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> n(0.0, 1.0);
  Case c{s, rows, {}, {}, {}};
  const size_t kvd = size_t(s.NKV) * s.HD;
  for (int i = 0; i < s.NH * s.HD; ++i) c.q.push_back(2.0 * n(rng));  // scores of a few units: a peaked softmax
  for (size_t i = 0; i < size_t(rows) * kvd; ++i) c.k.push_back(n(rng)), c.v.push_back(n(rng));
  return c;
}

// out[NH, HD] = softmax(q kᵀ / sqrt(HD)) v per head, in fp64, in the plainest order.
std::vector<double> reference(const Case& c) {
  const auto [NH, NKV, HD] = c.s;
  const size_t kvd = size_t(NKV) * HD;
  std::vector<double> out(size_t(NH) * HD, 0.0), score(size_t(c.rows));
  for (int h = 0; h < NH; ++h) {
    const size_t kh = size_t(h / (NH / NKV)) * HD;
    double mx = -INFINITY, sum = 0;
    for (int t = 0; t < c.rows; ++t) {
      double dot = 0;
      for (int e = 0; e < HD; ++e) dot += c.q[size_t(h) * HD + e] * c.k[t * kvd + kh + e];
      score[size_t(t)] = dot / std::sqrt(double(HD));
      mx = std::max(mx, score[size_t(t)]);
    }
    for (int t = 0; t < c.rows; ++t) sum += (score[size_t(t)] = std::exp(score[size_t(t)] - mx));
    for (int t = 0; t < c.rows; ++t)
      for (int e = 0; e < HD; ++e) out[size_t(h) * HD + e] += score[size_t(t)] / sum * c.v[t * kvd + kh + e];
  }
  return out;
}

template <typename T>
std::vector<T> as(const std::vector<double>& x) {
  return std::vector<T>(x.begin(), x.end());
}

template <typename T>
std::vector<T> decode(const Case& c) {
  const std::vector<T> q = as<T>(c.q), k = as<T>(c.k), v = as<T>(c.v);
  std::vector<T> out(q.size(), T(-7));  // (=): whatever was there goes
  attend_token(out.data(), q.data(), k.data(), v.data(), c.rows, c.s.NH, c.s.NKV, c.s.HD, nullptr);
  return out;
}

// The largest difference, relative to the largest |want|.
template <typename T>
double rel_error(const std::vector<T>& got, const std::vector<double>& want) {
  double most = 0, top = 0;
  for (size_t i = 0; i < want.size(); ++i)
    most = std::max(most, std::abs(double(got[i]) - want[i])), top = std::max(top, std::abs(want[i]));
  return most / top;
}

const Shape kShapes[] = {{2, 2, 64}, {4, 2, 8}, {3, 1, 5}};
const int kRows[] = {1, 5, 2047, 2048, 2049, 6000};

TEST(AttendToken, MatchesThePlainSoftmax) {
  unsigned seed = 1;
  for (const Shape& s : kShapes)
    for (int rows : kRows) {
      const Case c = make_case(s, rows, seed++);
      const std::vector<double> want = reference(c);
      EXPECT_LT(rel_error(decode<float>(c), want), 1e-5) << s.NH << ":" << s.NKV << "x" << s.HD << ", " << rows;
      EXPECT_LT(rel_error(decode<double>(c), want), 1e-12) << s.NH << ":" << s.NKV << "x" << s.HD << ", " << rows;
    }
}

TEST(AttendToken, TheBitsDoNotDependOnTheThreads) {
  const Case c = make_case({4, 2, 16}, 6000, 99);
  const int before = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<float> one = decode<float>(c);
  omp_set_num_threads(3);
  const std::vector<float> three = decode<float>(c);
  omp_set_num_threads(before);
  EXPECT_EQ(one, three);
}

// The cache of c sharded over P ranks (position t on rank t mod P, at row t / P), each rank's
// attend_token over its rows merged by the group; every rank's output.
std::vector<std::vector<float>> decode_tree(const Case& c, int P) {
  const size_t kvd = size_t(c.s.NKV) * c.s.HD;
  std::vector<std::vector<float>> outs(static_cast<size_t>(P));
  test::ThreadGroup::run(P, [&](Collective& g) {
    const CacheShard shard{P, g.rank()};
    const int rows = shard.rows(c.rows);
    std::vector<float> k(size_t(rows) * kvd), v(k.size()), q = as<float>(c.q), out(q.size());
    for (int t = 0; t < c.rows; ++t)
      if (shard.holds(t))
        for (size_t e = 0; e < kvd; ++e)
          k[size_t(shard.row(t)) * kvd + e] = float(c.k[t * kvd + e]),
                                       v[size_t(shard.row(t)) * kvd + e] = float(c.v[t * kvd + e]);
    omp_set_num_threads(1);  // a team per rank thread would only oversubscribe the test
    attend_token(out.data(), q.data(), k.data(), v.data(), rows, c.s.NH, c.s.NKV, c.s.HD, &g);
    outs[size_t(g.rank())] = out;
  });
  return outs;
}

TEST(AttendToken, TreeOverRanksMatchesOneProcessWithTheSameBitsEverywhere) {
  unsigned seed = 500;
  for (const Shape& s : kShapes)
    for (int rows : {1, 2, 7, 4097, 6001})  // 1 and 2 rows: a rank of 3 holds none
      for (int P : {2, 3}) {
        const Case c = make_case(s, rows, seed++);
        const std::vector<float> one = decode<float>(c);
        const std::vector<std::vector<float>> ranks = decode_tree(c, P);
        std::vector<double> want(one.begin(), one.end());
        EXPECT_LT(rel_error(ranks[0], want), 1e-5) << "P = " << P << ", " << rows << " rows";
        EXPECT_LT(rel_error(ranks[0], reference(c)), 1e-5) << "P = " << P << ", " << rows << " rows";
        for (int r = 1; r < P; ++r) EXPECT_EQ(ranks[size_t(r)], ranks[0]) << "rank " << r << " of " << P;
      }
}

}  // namespace
}  // namespace atl
