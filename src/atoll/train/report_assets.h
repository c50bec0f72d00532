// uPlot (MIT), the charting library of `atoll report` pages: the minified browser build and its
// stylesheet from third_party/uplot/, compiled in by CMake (cmake/uplot_asset.cc.in) so that the
// binary writes self-contained pages anywhere.
#pragma once

namespace atl {
extern const char* const kUplotJs;
extern const char* const kUplotCss;
}  // namespace atl
