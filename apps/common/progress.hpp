// common/progress.hpp — how far a run is, for the person watching it: zero-bench and zero-train
// show one status line on stderr ("zero-train: step 120/200, 3.1 step/s, ETA 26 s").
//
// Where it goes depends on what stderr is:
//  - a terminal (isatty, TERM not "dumb"): one line redrawn in place ("\r" + "\033[K", cut to the
//    terminal's width so that it never wraps), cleared while the program writes a line to stdout
//    (Pause) and redrawn after it, and cleared for good by finish() or the destructor;
//  - anything else (a pipe, a file, CI logs): no "\r", no escape codes: update() writes nothing,
//    milestone() one plain line "[program] text".
// A disabled Progress (--no-progress, a rank that does not print) writes nothing at all.
//
// The ETA is the measured mean pace so far: elapsed time since construction x (1 - done) / done.
//
// Thread safety: every member may be called from any thread; an internal mutex orders them.
// Pause nests, from any number of threads: the line is redrawn when the last Pause ends.
#pragma once

#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>

namespace zero::common {

class Progress {
 public:
  // `program` prefixes the line ("zero-bench"). `enabled` false: every call does nothing.
  // `out` is the stream the line goes to (stderr; a test may pass another).
  Progress(std::string program, bool enabled, std::FILE* out = stderr);
  ~Progress();  // finish()
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Whether the line is drawn in place (enabled, and `out` a terminal).
  bool on_terminal() const { return terminal_; }
  // Seconds since construction: the clock of the ETA (a caller's rate, "3.1 step/s").
  double elapsed_s() const;

  // The status after "program: " and the fraction of the whole run done (0..1, clamped); the
  // ETA is appended once done > 0. On a terminal the line is redrawn (after the current Pause,
  // if any); elsewhere nothing is written.
  void update(const std::string& status, double done);
  // A milestone of the run ("configuration 7/20: stage 2 +ckpt sqrt"): off a terminal one line
  // "[program] text" on `out` (stdout flushed first, so the two stay in order); on a terminal
  // nothing (update() shows it).
  void milestone(const std::string& text);
  // Clears the line for good (no more redraws): the run is over. Idempotent.
  void finish();

  // While a Pause lives, the status line is off the terminal: what the program writes to stdout
  // then (whole lines) never shares a line with it. Its end flushes stdout and redraws the line.
  class Pause {
   public:
    explicit Pause(Progress& p);
    ~Pause();
    Pause(const Pause&) = delete;
    Pause& operator=(const Pause&) = delete;

   private:
    Progress& p_;
  };

 private:
  void draw_locked();   // REQUIRES: mu_ held
  void clear_locked();  // REQUIRES: mu_ held

  const std::string program_;
  const bool enabled_;
  std::FILE* const out_;
  const bool terminal_;
  const std::chrono::steady_clock::time_point start_;
  std::mutex mu_;
  std::string line_;    // the text drawn (without "\r\033[K"), empty: none yet
  bool drawn_ = false;  // the line is on the terminal now
  int paused_ = 0;      // live Pause objects
  bool finished_ = false;
};

// "14 s", "2 min 05 s", "3 h 07 min": a duration for the status line.
std::string format_duration(double seconds);

}  // namespace zero::common
