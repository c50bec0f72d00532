// The import of `--init-from` alone (ckpt/import_hf.h), for bench/import_hf.sh: reads a Hugging
// Face folder into fp32 parameters as `atoll train --init-from` does, without the rest of a run
// (gradients and optimizer state would hide the import's own peak), and prints one JSON line:
// parameters, the fp32 model's MiB, the weight files' MiB, seconds (wall and CPU), MiB/s read and the peak
// resident set (VmHWM) with its ratio to the fp32 model.
//   import_hf_rss HF_DIR
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "atoll/ckpt/import_hf.h"
#include "atoll/model/layout.h"

namespace {

double cpu_seconds() {  // user + system time of this process so far
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

double vm_hwm_mib() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: import_hf_rss HF_DIR\n";
    return 2;
  }
  try {
    const atl::HfSource src = atl::read_hf_source(argv[1], atl::ModelConfig{});
    const atl::ParamLayout layout = atl::ParamLayout::build(src.model);
    const double before = vm_hwm_mib();
    const auto t0 = std::chrono::steady_clock::now();
    const double cpu0 = cpu_seconds();
    std::vector<float> params(layout.total());
    const nlohmann::json ev = atl::import_hf_weights(src, params.data());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double files = 0;
    for (const std::string& f : src.weight_files) files += double(std::filesystem::file_size(f));
    const double fp32 = double(layout.total()) * 4 / (1 << 20), peak = vm_hwm_mib();
    const nlohmann::json out = {{"params", layout.total()},
                                {"fp32_mib", fp32},
                                {"files_mib", files / (1 << 20)},
                                {"tensors", ev["tensors"]},
                                {"seconds", s},
                                {"cpu_seconds", cpu_seconds() - cpu0},
                                {"read_mib_per_s", files / (1 << 20) / s},
                                {"rss_before_mib", before},
                                {"peak_rss_mib", peak},
                                {"peak_over_fp32", peak / fp32}};
    std::cout << out.dump() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "import_hf_rss: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
