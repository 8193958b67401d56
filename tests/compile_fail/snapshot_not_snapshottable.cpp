// expect: the type is not io::snapshottable
// A type with no state accessors cannot be put in a snapshot: save_state says why.
#include <string>
#include <vector>

#include "trainkit/io/state.hpp"

namespace tk = trainkit;

struct with_state {  // get_state() with a plain struct: snapshottable
  struct state {
    long step = 0;
  };
  state get_state() const { return {}; }
  void set_state(const state&) {}
};
struct opaque {  // a private vector and no accessors: not snapshottable
  std::vector<double> history;
  opaque() = default;
  explicit opaque(int) {}
};

int main() {
  tk::io::snapshot snap;
#ifdef TRAINKIT_SHOULD_FAIL
  opaque x(1);
#else
  with_state x;
#endif
  tk::io::save_state(snap, "x", x);
  return 0;
}
