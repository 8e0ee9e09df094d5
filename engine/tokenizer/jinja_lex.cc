// Jinja lexing: template source -> text and tag pieces (whitespace control applied), and a tag's
// inner source -> expression tokens.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/jinja_ast.h"
#include "engine/tokenizer/unicode.h"

namespace moe::engine::jinja {
namespace {

constexpr const char* kSpace = " \t\n\r\f\v";

bool IsSpace(char c) { return c != '\0' && std::strchr(kSpace, c) != nullptr; }

// Line and column of byte offsets of `s`, whose offset 0 is at `start`, computed incrementally
// (offsets only grow).
class Locator {
 public:
  explicit Locator(const std::string& s, Pos start = {}) : s_(s), pos_(start) {}
  Pos At(size_t offset) {
    for (; done_ < offset && done_ < s_.size(); ++done_) {
      const unsigned char c = s_[done_];
      if (c == '\n') {
        ++pos_.line;
        pos_.column = 1;
      } else if ((c & 0xC0) != 0x80) {
        ++pos_.column;  // a UTF-8 continuation byte is part of the previous character
      }
    }
    return pos_;
  }

 private:
  const std::string& s_;
  size_t done_ = 0;
  Pos pos_;
};

// One tag or text run before whitespace control.
struct Item {
  enum class Kind { kText, kVariable, kBlock, kComment } kind;
  Pos pos, inner_pos;
  std::string body;          // text, or the inner source of a tag
  char left = 0, right = 0;  // '-', '+' or 0: the markers inside the delimiters
};

// End of a tag opened at `open` whose closing delimiter is `close` ("}}", "%}" or "#}"); quoted
// strings are skipped so that "{{ '}}' }}" works. npos when unclosed.
size_t FindClose(const std::string& s, size_t from, const char* close, bool quotes) {
  for (size_t i = from; i + 1 < s.size(); ++i) {
    if (quotes && (s[i] == '\'' || s[i] == '"')) {
      const char q = s[i];
      for (++i; i < s.size() && s[i] != q; ++i) {
        if (s[i] == '\\') ++i;
      }
      if (i >= s.size()) return std::string::npos;
      continue;
    }
    if (s[i] == close[0] && s[i + 1] == close[1]) return i;
  }
  return std::string::npos;
}

// Finds "{% endraw %}" (with optional markers) from `from`; returns its start and sets *end.
size_t FindEndRaw(const std::string& s, size_t from, size_t* end) {
  for (size_t i = s.find("{%", from); i != std::string::npos; i = s.find("{%", i + 2)) {
    size_t j = i + 2;
    if (j < s.size() && (s[j] == '-' || s[j] == '+')) ++j;
    while (j < s.size() && IsSpace(s[j])) ++j;
    if (s.compare(j, 6, "endraw") != 0) continue;
    j += 6;
    while (j < s.size() && IsSpace(s[j])) ++j;
    if (j < s.size() && (s[j] == '-' || s[j] == '+')) ++j;
    if (s.compare(j, 2, "%}") == 0) {
      *end = j + 2;
      return i;
    }
  }
  return std::string::npos;
}

std::vector<Item> Scan(const std::string& s) {
  std::vector<Item> items;
  Locator loc(s);
  size_t i = 0;
  while (i < s.size()) {
    size_t open = s.find('{', i);
    while (open != std::string::npos && open + 1 < s.size() && !std::strchr("{%#", s[open + 1])) {
      open = s.find('{', open + 1);
    }
    if (open == std::string::npos || open + 1 >= s.size()) open = s.size();
    if (open > i) items.push_back({Item::Kind::kText, loc.At(i), {}, s.substr(i, open - i)});
    if (open == s.size()) break;

    Item tag;
    tag.pos = loc.At(open);
    const char type = s[open + 1];
    const char* close = type == '{' ? "}}" : type == '%' ? "%}" : "#}";
    tag.kind = type == '{'   ? Item::Kind::kVariable
               : type == '%' ? Item::Kind::kBlock
                             : Item::Kind::kComment;
    size_t start = open + 2;
    if (start < s.size() && (s[start] == '-' || s[start] == '+')) tag.left = s[start++];
    const size_t end = FindClose(s, start, close, type != '#');
    if (end == std::string::npos) {
      throw ParseError(tag.pos.line, tag.pos.column,
                       absl::StrCat("'", s.substr(open, 2), "' is never closed by '", close, "'"));
    }
    size_t inner_end = end;
    if (inner_end > start && (s[inner_end - 1] == '-' || s[inner_end - 1] == '+')) {
      tag.right = s[--inner_end];
    }
    tag.inner_pos = loc.At(start);
    tag.body = s.substr(start, inner_end - start);
    i = end + 2;

    // {% raw %}: everything up to {% endraw %} is text. Its tags act as comments for whitespace
    // control, except that no newline is trimmed after "raw %}" (as Jinja2).
    const size_t b = tag.body.find_first_not_of(kSpace);
    const size_t e = tag.body.find_last_not_of(kSpace);
    if (tag.kind == Item::Kind::kBlock && b != std::string::npos &&
        tag.body.substr(b, e - b + 1) == "raw") {
      size_t raw_end = 0;
      const size_t raw_close = FindEndRaw(s, i, &raw_end);
      if (raw_close == std::string::npos) {
        throw ParseError(tag.pos.line, tag.pos.column, "'raw' is never closed by 'endraw'");
      }
      tag.kind = Item::Kind::kComment;
      if (tag.right != '-') tag.right = '+';
      items.push_back(tag);
      items.push_back({Item::Kind::kText, loc.At(i), {}, s.substr(i, raw_close - i)});
      Item end_tag{Item::Kind::kComment, loc.At(raw_close), {}, {}};
      if (s[raw_close + 2] == '-' || s[raw_close + 2] == '+') end_tag.left = s[raw_close + 2];
      if (s[raw_end - 3] == '-' || s[raw_end - 3] == '+') end_tag.right = s[raw_end - 3];
      items.push_back(end_tag);
      i = raw_end;
      continue;
    }
    items.push_back(std::move(tag));
  }
  return items;
}

}  // namespace

// Whitespace control, as Jinja2's lexer with trim_blocks and lstrip_blocks:
// - "{%-", "{{-", "{#-" strip all whitespace before the tag; "-%}", "-}}", "-#}" all after it.
// - lstrip_blocks: spaces and tabs between the start of a line and "{%" or "{#" are removed
//   (not before "{{", nor with "{%+").
// - trim_blocks: one newline right after "%}" or "#}" is removed (not after "+%}").
std::vector<Piece> SplitTemplate(const std::string& source) {
  std::vector<Item> items = Scan(source);
  bool line_starting = true;  // the previous tag's match ended with a newline (or none yet)
  for (size_t k = 0; k < items.size(); ++k) {
    Item& it = items[k];
    if (it.kind != Item::Kind::kText) continue;
    const Item* prev = k > 0 ? &items[k - 1] : nullptr;
    const Item* next = k + 1 < items.size() ? &items[k + 1] : nullptr;
    std::string& text = it.body;
    if (prev != nullptr && prev->kind != Item::Kind::kText) {
      if (prev->right == '-') {
        size_t n = text.find_first_not_of(kSpace);
        if (n == std::string::npos) n = text.size();
        line_starting = n > 0 && text[n - 1] == '\n';
        text.erase(0, n);
      } else if (prev->kind != Item::Kind::kVariable && prev->right != '+' && !text.empty() &&
                 text[0] == '\n') {
        text.erase(0, 1);
        line_starting = true;
      } else {
        line_starting = false;
      }
    }
    if (next != nullptr) {
      if (next->left == '-') {
        const size_t n = text.find_last_not_of(kSpace);
        text.erase(n == std::string::npos ? 0 : n + 1);
      } else if (next->kind != Item::Kind::kVariable && next->left != '+') {
        const size_t nl = text.rfind('\n');
        const size_t line = nl == std::string::npos ? 0 : nl + 1;
        if ((line > 0 || line_starting) &&
            text.find_first_not_of(" \t\r\f\v", line) == std::string::npos) {
          text.erase(line);
        }
      }
    }
  }
  std::vector<Piece> pieces;
  for (Item& it : items) {
    switch (it.kind) {
      case Item::Kind::kText:
        if (!it.body.empty())
          pieces.push_back({Piece::Kind::kText, it.pos, std::move(it.body), {}});
        break;
      case Item::Kind::kVariable:
        pieces.push_back({Piece::Kind::kVariable, it.pos, std::move(it.body), it.inner_pos});
        break;
      case Item::Kind::kBlock:
        pieces.push_back({Piece::Kind::kBlock, it.pos, std::move(it.body), it.inner_pos});
        break;
      case Item::Kind::kComment:
        break;
    }
  }
  return pieces;
}

namespace {

// Python string escapes, as Jinja2 decodes string literals ("unicode-escape"); code points are
// written with the tokenizer's AppendUtf8 (unicode.h).
bool ReadHex(const std::string& s, size_t at, int digits, uint32_t* cp) {
  if (at + digits > s.size()) return false;
  *cp = 0;
  for (int d = 0; d < digits; ++d) {
    const char c = s[at + d];
    int v = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (v < 0) return false;
    *cp = *cp * 16 + static_cast<uint32_t>(v);
  }
  return *cp <= 0x10FFFF;
}

bool IsNameStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool IsNameChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

}  // namespace

std::vector<Token> TokenizeExpression(const std::string& s, Pos start) {
  std::vector<Token> tokens;
  Locator loc(s, start);
  size_t i = 0;
  while (true) {
    while (i < s.size() && IsSpace(s[i])) ++i;
    const Pos pos = loc.At(i);
    Token t{Token::Kind::kEnd, pos, {}, {}};
    if (i >= s.size()) {
      tokens.push_back(t);
      return tokens;
    }
    const char c = s[i];
    if (IsNameStart(c)) {
      size_t j = i;
      while (j < s.size() && IsNameChar(s[j])) ++j;
      t.kind = Token::Kind::kName;
      t.text = s.substr(i, j - i);
      i = j;
    } else if (IsDigit(c)) {
      size_t j = i;
      while (j < s.size() && (IsDigit(s[j]) || s[j] == '_')) ++j;
      bool is_float = false;
      if (j + 1 < s.size() && s[j] == '.' && IsDigit(s[j + 1])) {
        is_float = true;
        for (++j; j < s.size() && (IsDigit(s[j]) || s[j] == '_'); ++j) {
        }
      }
      if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {
        size_t k = j + 1;
        if (k < s.size() && (s[k] == '+' || s[k] == '-')) ++k;
        if (k < s.size() && IsDigit(s[k])) {
          is_float = true;
          for (j = k; j < s.size() && IsDigit(s[j]); ++j) {
          }
        }
      }
      std::string digits;
      for (size_t k = i; k < j; ++k) {
        if (s[k] != '_') digits.push_back(s[k]);
      }
      try {
        if (is_float) {
          t.kind = Token::Kind::kFloat;
          t.number = std::stod(digits);
        } else {
          t.kind = Token::Kind::kInt;
          t.number = std::stoll(digits);
        }
      } catch (const std::exception&) {
        throw ParseError(pos.line, pos.column,
                         absl::StrCat("number '", digits, "' is out of range"));
      }
      t.text = digits;
      i = j;
    } else if (c == '\'' || c == '"') {
      t.kind = Token::Kind::kString;
      size_t j = i + 1;
      for (; j < s.size() && s[j] != c; ++j) {
        if (s[j] != '\\' || j + 1 >= s.size()) {
          t.text.push_back(s[j]);
          continue;
        }
        const char e = s[++j];
        uint32_t cp = 0;
        switch (e) {
          case 'n':
            t.text.push_back('\n');
            break;
          case 't':
            t.text.push_back('\t');
            break;
          case 'r':
            t.text.push_back('\r');
            break;
          case 'b':
            t.text.push_back('\b');
            break;
          case 'f':
            t.text.push_back('\f');
            break;
          case 'v':
            t.text.push_back('\v');
            break;
          case '0':
            t.text.push_back('\0');
            break;
          case '\\':
          case '\'':
          case '"':
            t.text.push_back(e);
            break;
          case '\n':
            break;  // a backslash-newline continues the line
          case 'x':
          case 'u':
          case 'U': {
            const int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            if (!ReadHex(s, j + 1, digits, &cp)) {
              throw ParseError(pos.line, pos.column,
                               absl::StrCat("bad \\", std::string(1, e), " escape in a string"));
            }
            AppendUtf8(cp, &t.text);
            j += digits;
            break;
          }
          default:  // unknown escapes stay as written, as in Python
            t.text.push_back('\\');
            t.text.push_back(e);
        }
      }
      if (j >= s.size()) throw ParseError(pos.line, pos.column, "unterminated string");
      i = j + 1;
    } else {
      static const char* kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*",
                                   "/",  "%",  "~",  "<",  ">",  "(",  ")", "[", "]",
                                   "{",  "}",  ",",  ":",  ".",  "|",  "="};
      t.kind = Token::Kind::kOp;
      for (const char* op : kOps) {
        if (s.compare(i, std::strlen(op), op) == 0) {
          t.text = op;
          break;
        }
      }
      if (t.text.empty()) {
        throw ParseError(pos.line, pos.column,
                         absl::StrCat("unexpected character '", std::string(1, c), "'"));
      }
      i += t.text.size();
    }
    tokens.push_back(std::move(t));
  }
}

}  // namespace moe::engine::jinja
