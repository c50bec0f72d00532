// Shared fixtures for the checkpoint tests: a small model, deterministic buffer contents and a
// scratch directory removed after each test.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "atoll/config/config.h"
#include "atoll/model/layout.h"

namespace atl::testing {

namespace fs = std::filesystem;

// V=64, C=16, L=2, NH=2 (HD=8), E=4, K=2, H=24: small, but every dimension differs from the
// others where it can, so a transposed or misplaced slice shows up.
inline ModelConfig small_model(bool tied = false) {
  ModelConfig m;
  m.vocab_size = 64;
  m.dim = 16;
  m.n_layers = 2;
  m.n_heads = 2;
  m.n_kv_heads = 1;
  m.head_dim = 8;
  m.n_experts = 4;
  m.top_k = 2;
  m.expert_hidden = 24;
  m.seq_len = 32;
  m.tie_embeddings = tied;
  return m;
}

// Distinct, exactly representable values per element and per seed: element i of buffer s is
// +-(s * 2^17 + i) * 2^-10, an integer below 2^24 (exact in fp32) for seeds below 127 and
// buffers below 2^17 elements; the sign alternates so sign bits are exercised too.
inline std::vector<float> pattern(size_t n, int seed) {
  EXPECT_LT(n, size_t(1) << 17);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    float x = static_cast<float>((int64_t(seed) << 17) + static_cast<int64_t>(i)) / 1024.0f;
    v[i] = (i % 2) ? -x : x;
  }
  return v;
}

// A fresh directory under the system temp dir, named after the running test.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("atoll_ckpt_" + std::string(info->test_suite_name()) + "_" + info->name() + "_" + std::to_string(::getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string str() const { return path_.string(); }
  std::string operator/(const std::string& rel) const { return (path_ / rel).string(); }

 private:
  fs::path path_;
};

// True when `text` contains `part`; used with EXPECT_TRUE(...) << text for readable failures.
inline bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace atl::testing
