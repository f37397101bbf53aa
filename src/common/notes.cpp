#include "common/notes.h"

#include <iostream>
#include <mutex>
#include <utility>

namespace spritetorch {

namespace {

std::mutex& note_mutex() {
  static std::mutex mutex;
  return mutex;
}

NoteHandler& current_handler() {
  static NoteHandler handler;
  return handler;
}

}  // namespace

NoteHandler set_note_handler(NoteHandler handler) {
  const std::lock_guard<std::mutex> lock(note_mutex());
  return std::exchange(current_handler(), std::move(handler));
}

void note(const std::string& line) {
  const std::lock_guard<std::mutex> lock(note_mutex());
  if (current_handler())
    current_handler()(line);
  else
    std::cerr << "note: " << line << "\n" << std::flush;
}

}  // namespace spritetorch
