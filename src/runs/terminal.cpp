#include "runs/terminal.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace spritetorch::runs {

TerminalStyle terminal_style(bool is_tty, const char* no_color, const char* term) {
  TerminalStyle style;
  if (!is_tty || (term && std::strcmp(term, "dumb") == 0)) return style;
  style.redraw = true;
  // no-color.org: set and not empty disables colour, whatever its value.
  style.color = !(no_color && no_color[0] != '\0');
  return style;
}

TerminalStyle detect_terminal(int fd) {
  return terminal_style(::isatty(fd) == 1, std::getenv("NO_COLOR"), std::getenv("TERM"));
}

int terminal_columns(int fd) {
  winsize size{};
  if (::ioctl(fd, TIOCGWINSZ, &size) != 0) return 0;
  return size.ws_col;
}

}  // namespace spritetorch::runs
