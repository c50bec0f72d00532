// Integers read from saved or received JSON (data cursors in checkpoints, transfers, records).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace atl {

// An integer field of saved or received JSON: nlohmann's get casts a float to the integer type
// (undefined behaviour when out of range, silently truncated otherwise), so anything but a JSON
// integer is a json type_error here, as a string would be.
template <typename T>
void json_integer_to(const nlohmann::json& v, T& out) {
  if (!v.is_number_integer())
    throw nlohmann::json::type_error::create(302, std::string("type must be an integer, but is ") + v.type_name(), &v);
  v.get_to(out);
}

}  // namespace atl
