// Tests of JinjaTemplate (engine/tokenizer/jinja.h). Expected strings are what Python Jinja2 3.1
// renders with transformers' settings (trim_blocks, lstrip_blocks, loopcontrols, its tojson).
#include "engine/tokenizer/jinja.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace moe::engine {
namespace {

using ::testing::HasSubstr;
using Json = TemplateJson;

// Renders `source` with `context`; the error message when parsing or rendering fails.
std::string R(const std::string& source, const Json& context = Json::object()) {
  absl::StatusOr<JinjaTemplate> t = JinjaTemplate::Parse(source);
  if (!t.ok()) return "PARSE ERROR: " + std::string(t.status().message());
  absl::StatusOr<std::string> out = t->Render(context);
  if (!out.ok()) return "ERROR: " + std::string(out.status().message());
  return *out;
}

std::string ParseError(const std::string& source) {
  absl::StatusOr<JinjaTemplate> t = JinjaTemplate::Parse(source);
  EXPECT_FALSE(t.ok()) << source;
  if (!t.ok()) {
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  }
  return t.ok() ? "" : std::string(t.status().message());
}

TEST(JinjaTest, TextAndOutput) {
  EXPECT_EQ(R("plain text"), "plain text");
  EXPECT_EQ(R("{{ x }}!", {{"x", "hi"}}), "hi!");
  EXPECT_EQ(R("{{ 'a' ~ 1 ~ none ~ true }}"), "a1NoneTrue");
  EXPECT_EQ(R("{{ 1.0 }} {{ 0.5 }} {{ 1e-5 }} {{ 1e20 }} {{ 10 / 4 }} {{ 7 // 2 }} {{ -7 // 2 }}"),
            "1.0 0.5 1e-05 1e+20 2.5 3 -4");
  EXPECT_EQ(R("{{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }}"),
            "1 2 1024 7 9");
  EXPECT_EQ(R("{{ [1, 'a', none, true] }} {{ {'k': 'v', 'n': 1} }}"),
            "[1, 'a', None, True] {'k': 'v', 'n': 1}");
  EXPECT_EQ(R("{{ 'a\\nb\\t\\'\\\"\\u00e9\\x41' }}"), "a\nb\t'\"éA");
  EXPECT_EQ(R("{{ \"it's\" }} {{ 'x' 'y' }}"), "it's xy");
  EXPECT_EQ(R("{{ undefined_thing }}|{{ undefined_thing.attr.deeper }}|"), "||");
  EXPECT_EQ(R("{{ '}}' }}"), "}}");
}

TEST(JinjaTest, IfElifElse) {
  const std::string t = "{% if x > 2 %}big{% elif x == 2 %}two{% else %}small{% endif %}";
  EXPECT_EQ(R(t, {{"x", 3}}), "big");
  EXPECT_EQ(R(t, {{"x", 2}}), "two");
  EXPECT_EQ(R(t, {{"x", 1}}), "small");
  EXPECT_EQ(R("{% if missing %}y{% else %}n{% endif %}"), "n");
  EXPECT_EQ(R("{% if '' or [] or {} or 0 or none %}y{% else %}n{% endif %}"), "n");
  EXPECT_EQ(R("{{ 'a' if x else 'b' }}{{ 'c' if not x }}", {{"x", false}}), "bc");
  EXPECT_EQ(R("{{ x and 'yes' }}|{{ x or 'fallback' }}", {{"x", ""}}), "|fallback");
}

TEST(JinjaTest, ForLoop) {
  const Json ctx = {{"xs", {"a", "b", "c"}}};
  EXPECT_EQ(
      R("{% for x in xs %}{{ loop.index }}{{ x }}{{ ',' if not loop.last }}{% endfor %}", ctx),
      "1a,2b,3c");
  EXPECT_EQ(R("{% for x in xs %}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
              "{{ loop.first }}{{ loop.length }} {% endfor %}",
              ctx),
            "032True3 121False3 210False3 ");
  EXPECT_EQ(R("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(R("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
              {{"d", Json::parse(R"({"z": 1, "a": 2})", nullptr, true, false)}}),
            "z=1;a=2;");  // insertion order, as Python dicts
  EXPECT_EQ(R("{% for x in xs if x != 'b' %}{{ loop.index }}{{ x }}{% endfor %}", ctx), "1a2c");
  EXPECT_EQ(
      R("{% for x in xs %}{% if x == 'b' %}{% continue %}{% endif %}{{ x }}{% endfor %}", ctx),
      "ac");
  EXPECT_EQ(R("{% for x in xs %}{% if x == 'b' %}{% break %}{% endif %}{{ x }}{% endfor %}", ctx),
            "a");
  EXPECT_EQ(R("{% for c in 'hé' %}[{{ c }}]{% endfor %}{% for k in {'a': 1} %}{{ k }}{% endfor %}"),
            "[h][é]a");
  EXPECT_EQ(R("{% for i in range(3) %}{{ i }}{% endfor %}{% for i in range(5, 0, -2) %}{{ i }}{% "
              "endfor %}"),
            "012531");
  // A set inside a loop does not leak out of it; a namespace carries state out.
  EXPECT_EQ(R("{% set n = 0 %}{% for x in xs %}{% set n = n + 1 %}{% endfor %}{{ n }}", ctx), "0");
  EXPECT_EQ(R("{% set ns = namespace(n=0) %}{% for x in xs %}{% set ns.n = ns.n + 1 %}{% endfor %}"
              "{{ ns.n }}",
              ctx),
            "3");
}

TEST(JinjaTest, SetMacroRaw) {
  EXPECT_EQ(R("{% set x = 'a' ~ 'b' %}{{ x }}"), "ab");
  EXPECT_EQ(R("{% set x %}block {{ 1 + 1 }}{% endset %}[{{ x }}]"), "[block 2]");
  EXPECT_EQ(R("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
              "{{ greet('Ann') }} {{ greet('Bo', punct='?') }}"),
            "Hi Ann! Hi Bo?");
  EXPECT_EQ(R("{% raw %}{{ not rendered }}{% endraw %}"), "{{ not rendered }}");
  EXPECT_EQ(R("{% generation %}kept{% endgeneration %}"), "kept");
}

TEST(JinjaTest, WhitespaceControl) {
  // trim_blocks removes the newline after a block tag, lstrip_blocks the indentation before it.
  EXPECT_EQ(R("{% if true %}\n  hi\n{% endif %}\n  x"), "  hi\n  x");
  EXPECT_EQ(R("  {% if true %}\n    a\n  {% endif %}\nb"), "    a\nb");
  EXPECT_EQ(R("a  {{- ' b ' -}}  c"), "a b c");
  EXPECT_EQ(R("a\n  {%- if true -%}\n  b\n{%- endif %}"), "ab");
  EXPECT_EQ(R("x {{ 1 }}\n{{ 2 }}"), "x 1\n2");  // no trimming around {{ }}
  EXPECT_EQ(R("a {# note #}\nb"), "a b");
  EXPECT_EQ(R("a\n    {# note #}\nb"), "a\nb");
  EXPECT_EQ(R("{% if true +%}\nkeep{% endif %}"), "\nkeep");
  EXPECT_EQ(R("x\n  {%+ if true %}y{% endif %}"), "x\n  y");
}

TEST(JinjaTest, Tests) {
  const Json ctx = {{"s", "x"},        {"n", 3},         {"f", 1.5}, {"l", {1}},
                    {"d", {{"k", 1}}}, {"nil", nullptr}, {"t", true}};
  EXPECT_EQ(R("{{ s is defined }}{{ missing is defined }}{{ missing is undefined }}", ctx),
            "TrueFalseTrue");
  EXPECT_EQ(R("{{ nil is none }}{{ s is none }}{{ s is string }}{{ n is string }}", ctx),
            "TrueFalseTrueFalse");
  EXPECT_EQ(R("{{ d is mapping }}{{ l is mapping }}{{ l is iterable }}{{ n is iterable }}", ctx),
            "TrueFalseTrueFalse");
  EXPECT_EQ(R("{{ n is number }}{{ f is number }}{{ s is number }}{{ t is boolean }}", ctx),
            "TrueTrueFalseTrue");
  EXPECT_EQ(
      R("{{ l is sequence }}{{ t is true }}{{ t is false }}{{ n is integer }}{{ f is float }}",
        ctx),
      "TrueTrueFalseTrueTrue");
  EXPECT_EQ(R("{{ n is equalto 3 }}{{ n is eq(4) }}{{ n is not none }}{{ n is odd }}", ctx),
            "TrueFalseTrueTrue");
  EXPECT_EQ(R("{{ 'b' in 'abc' }}{{ 1 in l }}{{ 'k' in d }}{{ 'z' not in d }}", ctx),
            "TrueTrueTrueTrue");
}

TEST(JinjaTest, Filters) {
  const Json ctx = {{"xs", {"b", "a", "b"}},
                    {"msgs", {{{"role", "user"}, {"c", 1}}, {{"role", "tool"}, {"c", 2}}}}};
  EXPECT_EQ(
      R("{{ '  x  ' | trim }}|{{ xs | length }}|{{ 'héé' | count }}|{{ xs | join('-') }}", ctx),
      "x|3|3|b-a-b");
  EXPECT_EQ(R("{{ missing | default('d') }}{{ '' | d('e', true) }}{{ 'x' | default('no') }}"),
            "dex");
  EXPECT_EQ(
      R("{{ 'aB' | upper }}{{ 'aB' | lower }}{{ 'hello world' | title }}{{ 'hI' | capitalize }}"),
      "ABabHello WorldHi");
  EXPECT_EQ(R("{{ xs | first }}{{ xs | last }}{{ xs | unique | list }}{{ 'ab' | list }}", ctx),
            "bb['b', 'a']['a', 'b']");
  EXPECT_EQ(R("{{ 3 | string ~ 'x' }}{{ '42' | int + 1 }}{{ '2.5' | float }}{{ 'aXa' | "
              "replace('a', 'b') }}"),
            "3x432.5bXb");
  EXPECT_EQ(R("{{ msgs | map(attribute='role') | join(',') }}", ctx), "user,tool");
  EXPECT_EQ(
      R("{{ msgs | selectattr('role', 'equalto', 'tool') | map(attribute='c') | list }}", ctx),
      "[2]");
  EXPECT_EQ(R("{{ msgs | rejectattr('role', 'eq', 'tool') | list | length }}", ctx), "1");
  EXPECT_EQ(
      R("{{ [1, none, 2] | select('none') | list }}{{ [1, none, 2] | reject('none') | list }}"),
      "[None][1, 2]");
  EXPECT_EQ(R("{{ {'a': 1} | items | list }}"), "[['a', 1]]");
  EXPECT_EQ(R("{{ 'a\nb' | indent(2) }}|{{ 'a\nb' | indent(2, true) }}"), "a\n  b|  a\n  b");
  EXPECT_EQ(R("{{ '<a&b>' | e }}{{ 'x' | safe }}"), "&lt;a&amp;b&gt;x");
}

TEST(JinjaTest, ToJsonMatchesPythonJsonDumps) {
  const Json v = Json::parse(R"({"name": "f", "b": [1, 2.5, "é\n\"", null, true], "e": {}})");
  EXPECT_EQ(R("{{ v | tojson }}", {{"v", v}}),
            R"({"name": "f", "b": [1, 2.5, "é\n\"", null, true], "e": {}})");
  EXPECT_EQ(R("{{ v | tojson(indent=2) }}", {{"v", Json::parse(R"({"a": [1], "b": []})")}}),
            "{\n  \"a\": [\n    1\n  ],\n  \"b\": []\n}");
  EXPECT_EQ(R("{{ '<tag>' | tojson }}"), "\"<tag>\"");  // transformers' tojson does not HTML-escape
}

TEST(JinjaTest, StringAndDictMethods) {
  EXPECT_EQ(
      R("{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith('bc') }}{{ 'abc'.startswith(('x', 'a')) }}"),
      "TrueTrueTrue");
  EXPECT_EQ(R("{{ 'a,b,,c'.split(',') }}{{ ' a  b '.split() }}{{ 'a b c'.split(' ', 1) }}"),
            "['a', 'b', '', 'c']['a', 'b']['a', 'b c']");
  EXPECT_EQ(R("[{{ '\n x \n'.strip() }}][{{ '\nx\n'.lstrip('\n') }}][{{ 'xyy'.rstrip('y') }}]"),
            "[x][x\n][x]");
  EXPECT_EQ(R("{{ 'aaa'.replace('a', 'b', 2) }}{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}{{ 'ab "
              "cd'.title() }}"),
            "bbaABabAb Cd");
  EXPECT_EQ(R("{{ '{} and {}'.format(1, 'x') }}"), "1 and x");
  EXPECT_EQ(R("{{ '{1}{0}{{}}{n}'.format('a', 'b', n=3) }}"), "ba{}3");
  EXPECT_THAT(R("{{ '{:>5}'.format(1) }}"), HasSubstr("format specs"));
  EXPECT_THAT(R("{{ '{99999999999}'.format(1) }}"), HasSubstr("out of range"));
  EXPECT_EQ(R("{{ 'a</think>b'.split('</think>')[-1] }}{{ 'abc'[::-1] }}{{ 'abc'[1:] }}"),
            "bcbabc");
  EXPECT_EQ(R("{{ xs[::-1] }}{{ xs[1:] }}{{ xs[:-1] }}{{ xs[-1] }}", {{"xs", {1, 2, 3}}}),
            "[3, 2, 1][2, 3][1, 2]3");
  EXPECT_EQ(R("{{ 'héllo'[1] }}{{ 'héllo'[-1] }}{{ 'café bar 1st' | title }}"), "éoCafé Bar 1St");
  const Json d = {{"d", {{"a", 1}}}};
  EXPECT_EQ(R("{{ d.get('a') }}{{ d.get('z') }}{{ d.get('z', 5) }}{{ d.keys() | list }}{{ "
              "d.values() | list }}",
              d),
            "1None5['a'][1]");
}

TEST(JinjaTest, RuntimeErrors) {
  EXPECT_EQ(R("{{ raise_exception('Roles must alternate') }}"), "ERROR: Roles must alternate");
  EXPECT_THAT(R("{{ 'a' + 1 }}"), HasSubstr("unsupported operand types for +: 'str' and 'int'"));
  EXPECT_THAT(R("{{ 'a' + d }}", {{"d", {{"k", 1}}}}), HasSubstr("'str' and 'dict'"));
  EXPECT_THAT(R("{{ 1 // 0 }}"), HasSubstr("by zero"));
  EXPECT_THAT(R("{% for x in 3 %}{% endfor %}"), HasSubstr("'int' is not iterable"));
  EXPECT_THAT(R("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}"), HasSubstr("nested too deeply"));
  EXPECT_THAT(R("{{ nosuch() }}"), HasSubstr("'nosuch' is undefined"));
  EXPECT_THAT(R("{% set x = 1 %}{% set x.a = 2 %}"), HasSubstr("not a namespace"));
  const Json deep = Json::parse(std::string(1000, '[') + std::string(1000, ']'));
  EXPECT_THAT(R("{{ v | tojson }}", {{"v", deep}}), HasSubstr("nested too deeply"));
  EXPECT_THAT(R("{{ v }}", {{"v", deep}}), HasSubstr("nested too deeply"));
}

TEST(JinjaTest, ParseErrorsNameLineAndColumn) {
  EXPECT_EQ(ParseError("ab\n  {% if x %}y"),
            "line 2, column 3: 'if' is never closed (expected 'endif')");
  EXPECT_EQ(ParseError("{% for x in y %}"),
            "line 1, column 1: 'for' is never closed (expected 'endfor')");
  EXPECT_EQ(ParseError("a {{ x "), "line 1, column 3: '{{' is never closed by '}}'");
  EXPECT_EQ(ParseError("\n\n{% frobnicate %}"), "line 3, column 1: unknown statement 'frobnicate'");
  EXPECT_EQ(ParseError("{% endif %}"), "line 1, column 1: unexpected 'endif'");
  EXPECT_EQ(ParseError("{{ 1 + }}"),
            "line 1, column 8: expected an expression, found the end of the tag");
  EXPECT_EQ(ParseError("x\n{{ a b }}"), "line 2, column 6: unexpected 'b'");
  EXPECT_EQ(ParseError("{{ 'abc }}"), "line 1, column 1: '{{' is never closed by '}}'");
  EXPECT_EQ(ParseError("{{ a ? b }}"), "line 1, column 6: unexpected character '?'");
  EXPECT_EQ(ParseError("é{{ (1 }}"), "line 1, column 8: expected ')', found the end of the tag");
  // As Jinja2 does at compile time: a template that needs a filter or test we lack fails at load.
  EXPECT_EQ(ParseError("{{ x | nosuchfilter }}"),
            "line 1, column 8: unknown filter 'nosuchfilter'");
  EXPECT_EQ(ParseError("{{ x is nosuchtest }}"), "line 1, column 9: unknown test 'nosuchtest'");
  EXPECT_EQ(ParseError("{% raw %}x"), "line 1, column 1: 'raw' is never closed by 'endraw'");
  EXPECT_THAT(ParseError("{{ " + std::string(1000, '(') + " }}"), HasSubstr("nested too deeply"));
}

}  // namespace
}  // namespace moe::engine
