// tests/monitor/test_progress.cpp - progress_line: what it draws on a terminal (forced with
// progress_mode::always into a temporary file), that it draws nothing when the output is not a
// terminal, the bar, counts, loss, ETA and memory fields, throttling, and the erase at the end.
// The example under a real pseudo-terminal is tested in examples/CMakeLists.txt.
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>  // setenv, unsetenv
#include <string>

#include "trainkit/monitor/progress.hpp"

using namespace trainkit;
using Catch::Matchers::Contains;
using Catch::Matchers::EndsWith;
using Catch::Matchers::StartsWith;

namespace {
/// Everything written to f so far.
std::string contents(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  for (int c; (c = std::fgetc(f)) != EOF;) s += static_cast<char>(c);
  return s;
}
}  // namespace

TEST_CASE("progress_line draws the bar, counts, loss, ETA and memory in place", "[monitor][progress]") {
  std::FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  {
    monitor::progress_line bar({.out = f, .mode = monitor::progress_mode::always, .refresh_seconds = 0, .width = 120});
    CHECK(bar.live());
    bar.begin("epoch 1/2", 4);
    bar.step(32, 0.5, 3 * 1024 * 1024);
    bar.step(32, 0.25, 3 * 1024 * 1024);
    const std::string now = bar.render();
    CHECK_THAT(now, StartsWith("epoch 1/2 ["));
    CHECK_THAT(now, Contains("] 2/4"));
    CHECK_THAT(now, Contains("loss 0.2500"));
    CHECK_THAT(now, Contains("samples/s"));
    CHECK_THAT(now, Contains("ETA 0:00"));
    CHECK_THAT(now, Contains("mem 3.0 MiB"));
    CHECK(static_cast<int>(now.size()) < 120);
    bar.step(32, 0.125, 0);
    bar.step(32, 0.0625, 0);
    bar.end();
  }
  const std::string out = contents(f);
  std::fclose(f);
  // One redraw per step (refresh 0) plus the first, each starting with a carriage return and
  // ending by erasing the rest of the line; end() erases the line.
  CHECK_THAT(out, StartsWith("\repoch 1/2 ["));
  CHECK_THAT(out, Contains("] 4/4"));
  CHECK_THAT(out, Contains("[==============================]"));  // full bar at 4/4 (30 columns)
  CHECK_THAT(out, EndsWith("\r\033[K"));
  std::size_t redraws = 0;
  for (std::size_t p = 0; (p = out.find('\r', p)) != std::string::npos; ++p) ++redraws;
  CHECK(redraws == 6);  // begin + 4 steps + end
}

TEST_CASE("progress_line draws nothing off a terminal, and throttles redraws", "[monitor][progress]") {
  std::FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  {
    monitor::progress_line automatic({.out = f});  // a file is not a terminal
    CHECK_FALSE(automatic.live());
    automatic.begin("epoch 1/1", 3);
    for (int i = 0; i < 3; ++i) automatic.step(8, 1.0);
    automatic.end();
    monitor::progress_line never({.out = f, .mode = monitor::progress_mode::never});
    CHECK_FALSE(never.live());
    never.begin("x", 1);
    never.step(1);
  }
  CHECK(contents(f).empty());

  std::FILE* g = std::tmpfile();
  {
    monitor::progress_line slow({.out = g, .mode = monitor::progress_mode::always, .refresh_seconds = 3600});
    slow.begin("pass", 100);
    for (int i = 0; i < 99; ++i) slow.step(1);  // throttled: none of these draws
    slow.step(1);                               // the last step always draws
  }
  const std::string out = contents(g);
  std::fclose(g);
  std::size_t redraws = 0;
  for (std::size_t p = 0; (p = out.find('\r', p)) != std::string::npos; ++p) ++redraws;
  CHECK(redraws == 3);  // begin, the last step, end (destructor)
  CHECK_THAT(out, Contains("100/100"));
}

TEST_CASE("progress_line without a total counts steps, and formats durations", "[monitor][progress]") {
  std::FILE* f = std::tmpfile();
  monitor::progress_line bar({.out = f, .mode = monitor::progress_mode::always, .refresh_seconds = 0});
  bar.begin("eval", 0);
  bar.step(10);
  const auto s = bar.render();
  CHECK_THAT(s, StartsWith("eval 1"));
  CHECK_FALSE(s.find("ETA") != std::string::npos);
  CHECK_FALSE(s.find("loss") != std::string::npos);  // no loss given
  bar.end();
  std::fclose(f);
  CHECK(monitor::progress_line::format_duration(0) == "0:00");
  CHECK(monitor::progress_line::format_duration(75.4) == "1:15");
  CHECK(monitor::progress_line::format_duration(3725) == "1:02:05");
  CHECK_THROWS_WITH(monitor::progress_line({.out = nullptr}), Contains("no output stream"));
  monitor::progress_line ok({.out = stdout, .mode = monitor::progress_mode::never});
  CHECK_THROWS_WITH(ok.begin("x", -1), Contains("total must be >= 0"));
}

TEST_CASE("TRAINKIT_PROGRESS overrides the automatic choice", "[monitor][progress]") {
  std::FILE* f = std::tmpfile();
  ::setenv("TRAINKIT_PROGRESS", "always", 1);
  CHECK(monitor::progress_line({.out = f}).live());  // a file, but asked for
  CHECK_FALSE(monitor::progress_line({.out = f, .mode = monitor::progress_mode::never}).live());
  ::setenv("TRAINKIT_PROGRESS", "never", 1);
  CHECK_FALSE(monitor::progress_line({.out = f}).live());
  CHECK(monitor::progress_line({.out = f, .mode = monitor::progress_mode::always}).live());  // the code wins
  ::unsetenv("TRAINKIT_PROGRESS");
  std::fclose(f);
}
