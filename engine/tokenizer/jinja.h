// JinjaTemplate: the subset of Jinja2 that Hugging Face chat templates use, parsed once and
// rendered many times. Written for chat templates, not as a general Jinja.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace moe::engine {

namespace jinja {
struct Node;
}

// Template data: JSON whose objects keep their key order (tools | tojson must print the
// properties in the order the client sent them, as Python dicts do).
using TemplateJson = nlohmann::ordered_json;

// Semantics follow transformers' chat-template environment (Jinja2 with trim_blocks and
// lstrip_blocks, loopcontrols, tojson = json.dumps(ensure_ascii=False)), with one deliberate
// leniency shared with @huggingface/jinja: an attribute or item of an undefined value is undefined
// (Jinja2 raises there). Supported: if/elif/else, for (loop.*, else, `if` filter, unpacking),
// set (names, namespace attributes, blocks), macro, break/continue, raw, generation; the
// expression grammar with filters, tests, slices, string/dict methods, range, namespace and
// raise_exception. IsFilter and IsTest (jinja_builtins.cc) list the filters and tests; an
// unknown one fails Parse, as Jinja2 fails at compile time.
class JinjaTemplate {
 public:
  // InvalidArgument "line L, column C: ..." for a template that does not parse.
  static absl::StatusOr<JinjaTemplate> Parse(const std::string& source);

  // InvalidArgument with the message for runtime errors: raise_exception(msg), an operation on
  // the wrong types, an unknown method or function, output over 64 MiB, macro recursion deeper
  // than 100.
  // `context` must be an object; its keys are the template's global variables.
  absl::StatusOr<std::string> Render(const TemplateJson& context) const;

 private:
  JinjaTemplate() = default;
  std::shared_ptr<const jinja::Node> root_;  // immutable, so copies share it
};

}  // namespace moe::engine
