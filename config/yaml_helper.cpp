// libvaswap_yaml.so: YAML through yaml-cpp's event parser, flattened to (path, scalar, line,
// column) as the events arrive. No node tree is built: an alias would make YAML::Load share one
// subtree under many parents, and walking that tree repeats it (a 400-byte "billion laughs"
// document took minutes and gigabytes). A policy needs no anchors or aliases, so the first one
// ends the parse with its place; nesting is bounded too, so a document costs time and memory in
// proportion to its size.
#include "yaml_helper.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/exceptions.h>
#include <yaml-cpp/parser.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace {

// A policy nests three levels deep (rules[0].offload); anything far deeper is not a policy.
constexpr size_t kMaxDepth = 32;

class Flattener : public YAML::EventHandler {
 public:
  Flattener(vaswap_yaml_visit_fn visit, void* context) : visit_(visit), context_(context) {}

  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}

  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    scalar(mark, anchor, std::string());
  }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                const std::string& value) override {
    scalar(mark, anchor, value);
  }
  void OnAnchor(const YAML::Mark& mark, const std::string& name) override {
    refuse(mark, "anchor &" + name);
  }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { refuse(mark, "an alias (*)"); }

  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    open(mark, anchor, false);
  }
  void OnSequenceEnd() override { stack_.pop_back(); }
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value) override {
    open(mark, anchor, true);
  }
  void OnMapEnd() override { stack_.pop_back(); }

 private:
  struct Frame {
    bool map = false;
    std::string path;
    size_t index = 0;      // sequences: the next item's index
    bool want_key = true;  // maps: the next scalar is a key
    std::string key;
  };

  [[noreturn]] static void refuse(const YAML::Mark& mark, const std::string& what) {
    throw YAML::ParserException(mark, what +
                                          ": anchors and aliases are not allowed in a vaswap "
                                          "policy; write the value out");
  }

  bool expecting_key() const {
    return !stack_.empty() && stack_.back().map && stack_.back().want_key;
  }

  // The path of the value that comes next, and the parent moved past it.
  std::string next_path() {
    if (stack_.empty()) return std::string();
    Frame& parent = stack_.back();
    if (parent.map) {
      parent.want_key = true;
      return parent.path.empty() ? parent.key : parent.path + "." + parent.key;
    }
    return parent.path + "[" + std::to_string(parent.index++) + "]";
  }

  void scalar(const YAML::Mark& mark, YAML::anchor_t anchor, const std::string& value) {
    if (anchor != YAML::NullAnchor) refuse(mark, "an anchor (&)");
    if (expecting_key()) {
      stack_.back().key = value;
      stack_.back().want_key = false;
      return;
    }
    visit_(context_, next_path().c_str(), value.c_str(), mark.line + 1, mark.column + 1);
  }

  void open(const YAML::Mark& mark, YAML::anchor_t anchor, bool map) {
    if (anchor != YAML::NullAnchor) refuse(mark, "an anchor (&)");
    if (expecting_key()) {
      throw YAML::ParserException(mark,
                                  "a key must be a plain word such as mode or selection, "
                                  "not a list or a mapping");
    }
    if (stack_.size() == kMaxDepth) {
      throw YAML::ParserException(mark, "the policy nests deeper than " +
                                            std::to_string(kMaxDepth) +
                                            " levels; a policy needs three at most");
    }
    Frame frame;
    frame.map = map;
    frame.path = next_path();
    stack_.push_back(std::move(frame));
  }

  vaswap_yaml_visit_fn visit_;
  void* context_;
  std::vector<Frame> stack_;
};

}  // namespace

extern "C" __attribute__((visibility("default"))) int vaswap_yaml_visit_string(
    const char* text, size_t size, const char* name, vaswap_yaml_visit_fn visit, void* context,
    char* error, size_t error_bytes) {
  try {
    std::istringstream in(std::string(text, size));
    YAML::Parser parser(in);
    Flattener flattener(visit, context);
    // The first document only, as YAML::Load reads it; no document at all is an empty value.
    if (!parser.HandleNextDocument(flattener)) visit(context, "", "", 1, 1);
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
