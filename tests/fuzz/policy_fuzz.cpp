// libFuzzer target for the policy parsers (config/policy.h): the YAML policy file and VASWAP_CONF.
// An input starting with 'C' is a VASWAP_CONF string; anything else is a YAML document. Each is
// applied to a policy and explained, as `vaswap check-policy` does. A crash, a leak, a hang or an
// error message without its source is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "policy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  vaswap::PolicyLoad load;
  if (!input.empty() && input[0] == 'C') {
    vaswap::apply_values(vaswap::conf_values(input.substr(1), &load.errors), &load);
  } else {
    vaswap::apply_values(vaswap::text_values(input, "fuzz.yaml", &load.errors), &load);
  }
  const std::string text = vaswap::explain(load);
  if (text.empty()) std::abort();  // every key is always explained
  for (const std::string& error : load.errors) {
    // Every message names its source.
    if (error.rfind("fuzz.yaml", 0) != 0 && error.rfind("VASWAP_CONF", 0) != 0) std::abort();
  }
  return 0;
}
