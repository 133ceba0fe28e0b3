// A check run on TOML text before toml++ parses it. toml++ 3.3.0 (Debian 12's) tests some
// non-ASCII characters for "whitespace" through a table lookup that ends in TOML_UNREACHABLE
// (__builtin_unreachable: undefined behaviour, in practice garbage or a crash) for most of U+00A1..
// U+0499, U+2D6E..U+3167 and U+FCC6..U+FEFE (a toml++ bug fixed in its 3.4.0). It does so
// wherever whitespace may appear: outside strings, right after a backslash in a multi-line basic
// string, and on the first character after a line-ending backslash there. TOML allows non-ASCII
// only inside quoted strings and comments, so the first two are errors in any case and are
// reported here with their line and column; the third is legal TOML that 3.3.0 cannot read, and
// is refused with the workaround (a \uXXXX escape). The same scan bounds the text's size
// (kMaxTomlBytes) and nesting (kMaxInputDepth, common/input_limits.hpp): toml++ limits nested arrays
// and inline tables itself, but not the parts of a dotted key or a table header, and it frees a table
// by recursion, so a key of a million parts (a.a.a...) overflows the stack. Header-only: the
// trainer, which links no fp8wire library, parses its presets with the same toml++.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "common/input_limits.hpp"
#include "common/toml.hpp"

namespace fp8wire {

// The largest TOML text read (a configuration, a threshold profile, a trainer preset): the largest
// fp8wire writes is a few KiB.
inline constexpr uint64_t kMaxTomlBytes = 1u << 20;

// The third case only exists in toml++ releases before 3.4 (a carried newer header reads it).
#if TOML_LIB_MAJOR == 3 && TOML_LIB_MINOR < 4
inline constexpr bool kTomlppMisreadsAfterLineEndingBackslash = true;
#else
inline constexpr bool kTomlppMisreadsAfterLineEndingBackslash = false;
#endif

struct TomlTextProblem {
  size_t line = 0;    // 1-based; 0 = no problem
  size_t column = 0;  // 1-based, in characters
  std::string what;
  bool over_limit = false;  // valid TOML, perhaps, but past kMaxTomlBytes or kMaxInputDepth
  explicit operator bool() const { return line != 0; }
};

namespace detail {
// Decodes the UTF-8 character at text[i] (0 when it is not valid UTF-8: toml++ reports that itself).
inline char32_t utf8_at(std::string_view text, size_t i, size_t& length) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char b = byte(i);
  length = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 1;
  if (length == 1) return b < 0x80 ? b : 0;
  if (i + length > text.size()) {
    length = 1;
    return 0;
  }
  char32_t c = b & (0xFF >> (length + 1));
  for (size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) {
      length = 1;
      return 0;
    }
    c = (c << 6) | (byte(i + k) & 0x3F);
  }
  return c;
}

// Whether `text` is valid UTF-8 (what TOML requires of every string).
inline bool utf8_valid(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    size_t length = 0;
    if (static_cast<unsigned char>(text[i]) >= 0x80 && utf8_at(text, i, length) == 0) return false;
    i += static_cast<unsigned char>(text[i]) >= 0x80 ? length : 1;
  }
  return true;
}

// toml++'s whitespace outside ASCII (Unicode's Zs and a few more, tested by
// is_non_ascii_horizontal_whitespace / is_non_ascii_vertical_whitespace), for code points that do not
// reach the faulty path below.
inline bool tomlpp_non_ascii_whitespace(char32_t c) {
  return c == 0xA0 || c == 0x1680 || c == 0x180E || (c >= 0x2000 && c <= 0x200B) || c == 0x202F ||
         (c >= 0x205F && c <= 0x2060) || c == 0x3000 || c == 0xFEFF || c == 0x2028 || c == 0x2029 || c == 0x85;
}

// The code points for which toml++ 3.3.0's is_non_ascii_horizontal_whitespace() reaches
// TOML_UNREACHABLE: its first-level index (c - 0xA0) / 0x3FA is one of the blocks its bitmask lets
// through (0, 11, 63) and c is none of the three it answers directly.
inline bool tomlpp_33_unreachable(char32_t c) {
  if (c < 0xA0 || c > 0xFEFF) return false;
  const uint64_t block = (static_cast<uint64_t>(c) - 0xA0u) / 0x3FAu;
  if ((1ull << block) & 0x7FFFFFFFFFFFF75Eull) return false;
  if (c == 0xA0 || c == 0x3000 || c == 0xFEFF) return false;
  return block != 5 && block != 7;
}
}  // namespace detail

// Scans `text` as toml++ reads it (comments, the four string kinds and their escapes, bare tokens,
// table headers against array brackets) and returns the first position toml++ would mishandle, or
// an empty problem. Call it before toml::parse. A quote opens a string only where toml++ starts
// one (at a key or value position: line start, after '=', '[', '{', ',', or '.' inside a key);
// elsewhere it is part of a bare token, which toml++ scans character by character through the
// faulty whitespace test (2024-01-01"<U+FEF7> is one bad date to it, not a date and a string).
// Also refused: a table header whose first character cannot begin a key (toml++ assumes it can:
// TOML_ASSERT_ASSUME; a debug build asserts, an optimised one may do anything).
// Also refused: a text over kMaxTomlBytes, and nesting past kMaxInputDepth levels, where a table, an
// array, an inline table and each part of a dotted key or table header is a level.
inline TomlTextProblem toml_check_text(std::string_view text) {
  if (text.size() > kMaxTomlBytes)
    return TomlTextProblem{1, 1,
                           fmt::format("the TOML text is {} bytes, more than its limit of {}", text.size(),
                                       bytes_and_mib(kMaxTomlBytes)),
                           true};
  enum class State { outside, comment, basic, literal, multi_basic, multi_literal };
  State state = State::outside;
  std::string open;         // "[" of arrays and "{" of inline tables, innermost last (not headers)
  // Nesting: the levels of the current table (its header's parts), of each open array or inline
  // table (parallel to `open`), the dots of the key being read, and the level of the value after '='.
  std::vector<size_t> open_depth;
  size_t table_depth = 0, key_dots = 0, value_depth = 0;
  bool in_header = false, array_header = false;
  bool line_start = true;   // only spaces and tabs so far on this line, outside strings and comments
  char prev = '\n';         // the last character outside strings that was not a space ('\n': line start)
  bool key_context = true;  // a key may come next (line start, a header, an inline table's '{' or ',')
  bool bare = false;        // inside a bare key or value
  size_t line = 1, column = 1;
  auto problem = [&](std::string what) { return TomlTextProblem{line, column, std::move(what)}; };
  auto too_deep = [&] {
    TomlTextProblem p = problem(fmt::format("nested deeper than its limit of {} levels (each table, array, inline "
                                            "table and part of a dotted key is one)",
                                            kMaxInputDepth));
    p.over_limit = true;
    return p;
  };
  // The level of the key being read: its parts below the table or inline table it is in.
  auto key_depth = [&] {
    return (in_header ? 0 : open_depth.empty() ? table_depth : open_depth.back()) + key_dots + 1;
  };
  auto starts = [&](size_t i, std::string_view s) { return text.substr(i, s.size()) == s; };
  size_t i = 0;
  if (starts(0, "\xEF\xBB\xBF")) i = 3;  // a UTF-8 byte-order mark, which toml++ skips
  // Moves past n bytes, keeping line and column (in characters).
  auto advance = [&](size_t n) {
    for (size_t end = i + n; i < end && i < text.size(); ++i) {
      const auto b = static_cast<unsigned char>(text[i]);
      if (b == '\n') {
        ++line;
        column = 1;
      } else if ((b & 0xC0) != 0x80) {
        ++column;
      }
    }
  };
  while (i < text.size()) {
    const auto b = static_cast<unsigned char>(text[i]);
    switch (state) {
      case State::outside: {
        if (bare && b < 0x80) {
          // Inside a bare token (a key, a number, a date, a boolean): toml++ reads to the next
          // terminator, and quotes and brackets before it are part of the token.
          const bool ends = b == ' ' || b == '\t' || b == '\r' || b == '\n' || b == ']' || b == '}' || b == ',' ||
                            b == '#' || (key_context && (b == '=' || b == '.'));
          if (!ends) {
            prev = static_cast<char>(b);
            advance(1);
            break;
          }
          bare = false;  // and the terminator is read below
        }
        if (b >= 0x80) {
          size_t length = 0;
          const char32_t c = detail::utf8_at(text, i, length);
          return problem(c ? fmt::format("non-ASCII character U+{:04X} outside a quoted string or comment (TOML "
                                         "allows non-ASCII only in strings and comments; quote the key or value)",
                                         static_cast<uint32_t>(c))
                           : std::string("a byte that is not UTF-8 outside a quoted string or comment"));
        }
        if (b == '\n') {
          line_start = true;
          prev = '\n';
          if (open.empty()) {
            key_context = true;
            key_dots = 0;
          }
          advance(1);
          break;
        }
        if (b == ' ' || b == '\t' || b == '\r') {
          advance(1);
          break;
        }
        if (b == '[' && line_start && open.empty()) {
          // A table header: the first character after "[" or "[[" and their spaces must begin a key.
          size_t k = i + 1;
          while (k < text.size() && (text[k] == ' ' || text[k] == '\t')) ++k;
          if (k == i + 1 && k < text.size() && text[k] == '[') {
            ++k;
            while (k < text.size() && (text[k] == ' ' || text[k] == '\t')) ++k;
          }
          const char c = k < text.size() ? text[k] : ']';  // at the end toml++ reports the error itself
          const bool key_start = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                                 c == '_' || c == '-' || c == '"' || c == '\'' || c == ']';
          array_header = i + 1 < text.size() && text[i + 1] == '[';
          advance(k - i);  // past the brackets: they open no array
          if (!key_start) return problem("a table header must begin with a key (bare or quoted)");
          line_start = false;
          prev = '[';
          key_context = true;
          in_header = true;
          key_dots = 0;
          break;
        }
        line_start = false;
        const bool string_may_start = prev == '\n' || prev == '=' || prev == '[' || prev == '{' || prev == ',' ||
                                      (prev == '.' && key_context);
        if ((b == '"' || b == '\'') && string_may_start) {
          prev = static_cast<char>(b);
          const bool triple = b == '"' ? starts(i, "\"\"\"") : starts(i, "'''");
          if (triple) state = b == '"' ? State::multi_basic : State::multi_literal;
          else state = b == '"' ? State::basic : State::literal;
          advance(triple ? 3 : 1);
          break;
        }
        switch (b) {
          case '#': state = State::comment; break;
          case '=':
            value_depth = key_depth();
            key_dots = 0;
            key_context = false;
            break;
          case '[':
          case '{': {
            // A value after '=' sits at its key's level; an array's element one below the array.
            const size_t depth = prev == '=' || open_depth.empty() ? value_depth : open_depth.back() + 1;
            if (depth > kMaxInputDepth) return too_deep();
            open.push_back(static_cast<char>(b));
            open_depth.push_back(depth);
            key_context = b == '{';
            key_dots = 0;
            break;
          }
          case ']':
          case '}':
            if (!open.empty()) {
              open.pop_back();
              open_depth.pop_back();
            } else if (in_header) {  // the end of a table header: its parts (and an array's level)
              table_depth = key_dots + 1 + (array_header ? 1 : 0);
              in_header = false;
              key_dots = 0;
              if (table_depth > kMaxInputDepth) return too_deep();
            }
            key_context = false;
            break;
          case ',':
            key_context = !open.empty() && open.back() == '{';
            key_dots = 0;
            break;
          case '.':  // between the segments of a dotted key
            if (key_context && (++key_dots, key_depth() > kMaxInputDepth)) return too_deep();
            break;
          default: bare = true; break;  // a bare token begins
        }
        prev = static_cast<char>(b);
        advance(1);
        break;
      }
      case State::comment:
        if (b == '\n') {
          state = State::outside;  // the newline is the outside's
          break;
        }
        advance(1);
        break;
      case State::basic:
        if (b == '\n') {
          state = State::outside;  // unterminated: toml++ reports it
          break;
        }
        if (b == '\\') {
          advance(2);  // toml++ checks single-line escapes without the faulty lookup
          break;
        }
        if (b == '"') state = State::outside;
        advance(1);
        break;
      case State::literal:
        if (b == '\n') {
          state = State::outside;
          break;
        }
        if (b == '\'') state = State::outside;
        advance(1);
        break;
      case State::multi_literal:
        if (starts(i, "'''")) {
          advance(3);
          while (i < text.size() && text[i] == '\'') advance(1);  // up to two quotes end the content
          state = State::outside;
          break;
        }
        advance(1);
        break;
      case State::multi_basic: {
        if (starts(i, "\"\"\"")) {
          advance(3);
          while (i < text.size() && text[i] == '"') advance(1);
          state = State::outside;
          break;
        }
        if (b != '\\') {
          advance(1);
          break;
        }
        advance(1);  // the backslash
        if (i >= text.size()) break;
        const auto next = static_cast<unsigned char>(text[i]);
        if (next >= 0x80)
          return problem("a non-ASCII character right after a backslash in a multi-line string (not a valid "
                         "escape)");
        if (next != ' ' && next != '\t' && next != '\r' && next != '\n') {
          advance(1);  // an ordinary escape: \n, \", \uXXXX ...
          break;
        }
        // A line-ending backslash: the whitespace and line breaks after it are trimmed, and
        // toml++ 3.3.0 tests the first character after them with the faulty lookup.
        // toml++ trims its own idea of whitespace, which includes some non-ASCII characters.
        while (i < text.size()) {
          const auto w = static_cast<unsigned char>(text[i]);
          if (w == ' ' || w == '\t' || w == '\r' || w == '\n') {
            advance(1);
            continue;
          }
          if (w < 0x80) break;
          size_t length = 0;
          const char32_t c = detail::utf8_at(text, i, length);
          if (kTomlppMisreadsAfterLineEndingBackslash && detail::tomlpp_33_unreachable(c))
            return problem(fmt::format("U+{:04X} as the first character after a line-ending backslash is legal "
                                       "TOML that this toml++ (3.3) cannot read; write it as \\u{:04X}",
                                       static_cast<uint32_t>(c), static_cast<uint32_t>(c)));
          if (c == 0 || !detail::tomlpp_non_ascii_whitespace(c)) break;
          advance(length);
        }
        break;
      }
    }
  }
  return {};
}

}  // namespace fp8wire
