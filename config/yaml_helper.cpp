// libvaswap_yaml.so: YAML through yaml-cpp, flattened to (path, scalar, line, column).
#include "yaml_helper.h"

#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <string>

namespace {

void walk(const YAML::Node& node, const std::string& path, vaswap_yaml_visit_fn visit, void* ctx) {
  const YAML::Mark mark = node.Mark();
  switch (node.Type()) {
    case YAML::NodeType::Map:
      for (const auto& item : node) {
        std::string child = path;
        if (!child.empty()) child += '.';
        child += item.first.Scalar();
        walk(item.second, child, visit, ctx);
      }
      break;
    case YAML::NodeType::Sequence:
      for (size_t i = 0; i < node.size(); ++i) {
        walk(node[i], path + "[" + std::to_string(i) + "]", visit, ctx);
      }
      break;
    case YAML::NodeType::Scalar:
      visit(ctx, path.c_str(), node.Scalar().c_str(), mark.line + 1, mark.column + 1);
      break;
    default:  // null: a key with no value
      visit(ctx, path.c_str(), "", mark.line + 1, mark.column + 1);
      break;
  }
}

template <class Load>
int visit_document(const char* name, Load load, vaswap_yaml_visit_fn visit, void* context,
                   char* error, size_t error_bytes) {
  try {
    const YAML::Node root = load();
    walk(root, "", visit, context);
    return 0;
  } catch (const YAML::Exception& e) {
    if (error != nullptr && error_bytes > 0) {
      if (e.mark.is_null()) {
        std::snprintf(error, error_bytes, "%s: %s", name, e.msg.c_str());
      } else {
        std::snprintf(error, error_bytes, "%s:%d:%d: %s", name, e.mark.line + 1, e.mark.column + 1,
                      e.msg.c_str());
      }
    }
    return -1;
  }
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int vaswap_yaml_visit_file(
    const char* file, vaswap_yaml_visit_fn visit, void* context, char* error, size_t error_bytes) {
  return visit_document(
      file, [&] { return YAML::LoadFile(file); }, visit, context, error, error_bytes);
}

extern "C" __attribute__((visibility("default"))) int vaswap_yaml_visit_string(
    const char* text, size_t size, const char* name, vaswap_yaml_visit_fn visit, void* context,
    char* error, size_t error_bytes) {
  return visit_document(
      name, [&] { return YAML::Load(std::string(text, size)); }, visit, context, error,
      error_bytes);
}
