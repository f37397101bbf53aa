// How progress is drawn on a stream: redrawn in place on a terminal, plain lines elsewhere (CI
// logs, files, pipes), colour only on a terminal and never when NO_COLOR is set
// (https://no-color.org).
#pragma once

namespace spritetorch::runs {

struct TerminalStyle {
  bool redraw = false;  // a terminal: one progress line per epoch, redrawn with '\r'
  bool color = false;   // ANSI colours (implies redraw)
};

// The decision itself, from its inputs, so that tests can cover every case. no_color / term: the
// values of NO_COLOR and TERM, nullptr when unset. A "dumb" terminal gets plain lines.
TerminalStyle terminal_style(bool is_tty, const char* no_color, const char* term);
// For file descriptor `fd` of this process and its environment.
TerminalStyle detect_terminal(int fd);

// The width of the terminal on `fd` now, in columns (it can change while a run draws); 0 when it is
// no terminal or does not say.
int terminal_columns(int fd);

}  // namespace spritetorch::runs
