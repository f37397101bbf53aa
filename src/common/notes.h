// Notes the library has for whoever runs it: a sprite folder's stray files, a resumed run's new lr,
// a damaged but readable PNG, a kernel that fell back. They are not errors (the work goes on) and
// not progress (that is TrainObserver's): each goes to one handler for the process, by default
// stderr as "note: <line>", where the CLI wants them. A program that embeds the library sets its
// own handler to log them elsewhere, or one that does nothing to keep its stderr quiet (as
// LibTorch's own warnings go through c10::WarningUtils::set_warning_handler).
#pragma once

#include <functional>
#include <string>

namespace spritetorch {

using NoteHandler = std::function<void(const std::string& line)>;

// Sets the process's note handler and returns the one before; an empty handler is stderr again.
// Thread-safe; the handler is called under a lock, one note at a time, from whichever thread has
// the note.
NoteHandler set_note_handler(NoteHandler handler);

// Hands `line` (no "note: " prefix, no newline) to the handler.
void note(const std::string& line);

}  // namespace spritetorch
