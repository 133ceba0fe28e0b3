#pragma once
// How fp8wire's programs read their command line with CLI11: one form for a usage error in every
// tool. CLI11's own handling (CLI11_PARSE) prints the error without the program's name and exits
// with its internal codes (105 for a failed check, 106 for a missing option, 109 for an unexpected
// argument); here a usage error is one line naming the tool and its subcommand, a hint naming the
// command as the user typed it, and exit status 2, as every other bad input to these tools gets.
//
// The name in --help's usage line is argv[0]: the `fp8wire` command starts the packaged programs
// with argv[0] set to what the user typed ("fp8wire bench"), so their help shows that command and
// not the program's path inside site-packages.
#include <optional>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

namespace fp8wire {

// The status a program returns for bad usage (argparse's too, for the `fp8wire` command).
inline constexpr int kUsageErrorStatus = 2;

// Parses argv into `app`. Returns nothing when the program should go on; otherwise the status to
// exit with: 0 after --help (printed to stdout), kUsageErrorStatus after a usage error (printed to
// stderr as "TOOL[ SUBCOMMAND]: what was wrong" and how to see the help).
inline std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv, std::string_view tool) {
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // The subcommands read so far: the error belongs to the last of them.
    std::string where(tool), typed = app.get_name();
    for (const CLI::App* sub = &app; !sub->get_subcommands().empty();) {
      sub = sub->get_subcommands().back();
      where += " " + sub->get_name();
      typed += " " + sub->get_name();
    }
    fmt::print(stderr, "{}: {}\nRun `{} --help` for the options.\n", where, e.what(), typed);
    return kUsageErrorStatus;
  }
}

}  // namespace fp8wire
