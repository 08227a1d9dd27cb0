#include "common/progress.hpp"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace zero::common {

namespace {

// A terminal that understands "\033[K" (erase to the end of the line): not TERM=dumb (Emacs'
// shell buffers, some CI runners that allocate a pty).
bool is_terminal(std::FILE* out) {
  if (out == nullptr || isatty(fileno(out)) == 0) return false;
  const char* term = std::getenv("TERM");
  return term == nullptr || std::strcmp(term, "dumb") != 0;
}

// The terminal's columns; 0 when unknown (a pty nobody sized).
std::size_t columns(std::FILE* out) {
  winsize ws{};
  if (ioctl(fileno(out), TIOCGWINSZ, &ws) != 0) return 0;
  return ws.ws_col;
}

}  // namespace

std::string format_duration(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return "?";
  const auto s = static_cast<long long>(std::llround(seconds));
  char b[48];
  if (s < 100) {
    std::snprintf(b, sizeof b, "%lld s", s);
  } else if (s < 3600) {
    std::snprintf(b, sizeof b, "%lld min %02lld s", s / 60, s % 60);
  } else {
    std::snprintf(b, sizeof b, "%lld h %02lld min", s / 3600, s / 60 % 60);
  }
  return b;
}

Progress::Progress(std::string program, bool enabled, std::FILE* out)
    : program_(std::move(program)),
      enabled_(enabled),
      out_(out),
      terminal_(enabled && is_terminal(out)),
      start_(std::chrono::steady_clock::now()) {}

Progress::~Progress() { finish(); }

double Progress::elapsed_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Progress::update(const std::string& status, double done) {
  if (!terminal_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  line_ = program_ + ": " + status;
  done = std::clamp(done, 0.0, 1.0);
  if (done > 0) line_ += ", ETA " + format_duration(elapsed_s() * (1 - done) / done);
  if (paused_ == 0) draw_locked();
}

void Progress::milestone(const std::string& text) {
  if (!enabled_ || terminal_) return;
  std::lock_guard<std::mutex> lock(mu_);
  std::fflush(stdout);
  std::fprintf(out_, "[%s] %s\n", program_.c_str(), text.c_str());
  std::fflush(out_);
}

void Progress::finish() {
  if (!terminal_) return;
  std::lock_guard<std::mutex> lock(mu_);
  clear_locked();
  finished_ = true;
}

void Progress::draw_locked() {
  if (finished_ || line_.empty()) return;
  std::string text = line_;
  // One column short of the width: a line that fills the last column makes some terminals
  // wrap, and "\r\033[K" then erases only the second row.
  const std::size_t width = columns(out_);
  if (width > 1 && text.size() > width - 1) text.resize(width - 1);
  std::fprintf(out_, "\r\033[K%s", text.c_str());
  std::fflush(out_);
  drawn_ = true;
}

void Progress::clear_locked() {
  if (!drawn_) return;
  std::fputs("\r\033[K", out_);
  std::fflush(out_);
  drawn_ = false;
}

Progress::Pause::Pause(Progress& p) : p_(p) {
  if (!p_.terminal_) return;
  std::lock_guard<std::mutex> lock(p_.mu_);
  if (p_.paused_++ == 0) p_.clear_locked();
}

Progress::Pause::~Pause() {
  if (!p_.terminal_) return;
  std::lock_guard<std::mutex> lock(p_.mu_);
  std::fflush(stdout);  // the lines written under the pause reach the terminal first
  if (--p_.paused_ == 0) p_.draw_locked();
}

}  // namespace zero::common
