#include "codec/format/pickle_scan.hpp"

#include <charconv>
#include <cstring>
#include <limits>
#include <optional>
#include <string_view>
#include <unordered_map>

#include "codec/error.hpp"

namespace ckpt::format {
namespace {

using kind = pickle_graph::kind;
using node = pickle_graph::node;

class machine {
 public:
  machine(std::span<const std::byte> in, const pickle_limits& lim) : in_(in), lim_(lim) {}

  pickle_scan run() {
    execute();
    name_tensors(stack_.back());
    return std::move(result_);
  }

  pickle_graph graph() {
    execute();
    pickle_graph g;
    g.root = stack_.back();
    g.nodes = std::move(nodes_);
    return g;
  }

 private:
  void execute() {
    for (;;) {
      const auto op = std::to_integer<unsigned char>(take(1)[0]);
      if (op == '.') break;  // STOP
      step(op);
    }
    if (stack_.size() != 1 || !marks_.empty()) throw corrupt_error("pickle: unbalanced at STOP");
  }

  // ---- input ------------------------------------------------------------------------------
  std::span<const std::byte> take(std::size_t n) {
    if (n > in_.size() - pos_) throw corrupt_error("pickle: truncated");
    auto s = in_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  template <class T>
  T take_le() {
    T v;
    std::memcpy(&v, take(sizeof(T)).data(), sizeof(T));
    return v;
  }
  std::string_view take_line() {
    const auto* begin = in_.data() + pos_;
    const auto* nl = static_cast<const std::byte*>(std::memchr(begin, '\n', in_.size() - pos_));
    if (!nl) throw corrupt_error("pickle: unterminated line");
    const auto n = std::size_t(nl - begin);
    pos_ += n + 1;
    return {reinterpret_cast<const char*>(begin), n};
  }
  std::string_view take_str(std::uint64_t n) {
    if (n > in_.size() - pos_) throw corrupt_error("pickle: string beyond end");
    auto s = take(std::size_t(n));
    return {reinterpret_cast<const char*>(s.data()), s.size()};
  }

  // ---- values -----------------------------------------------------------------------------
  std::uint32_t make(kind k) {
    if (nodes_.size() >= lim_.max_nodes) throw corrupt_error("pickle: too many values");
    nodes_.emplace_back();
    nodes_.back().k = k;
    return std::uint32_t(nodes_.size() - 1);
  }
  std::uint32_t make_int(std::int64_t v, bool big = false) {
    const auto n = make(kind::integer);
    nodes_[n].i = v;
    nodes_[n].big = big;
    return n;
  }
  std::uint32_t make_str(kind k, std::string_view s) {
    const auto n = make(k);
    nodes_[n].s.assign(s);
    return n;
  }
  void push(std::uint32_t v) {
    if (stack_.size() + marks_.size() >= lim_.max_stack) throw corrupt_error("pickle: too deep");
    stack_.push_back(v);
  }
  std::uint32_t pop() {
    if (stack_.empty() || (!marks_.empty() && marks_.back() == stack_.size()))
      throw corrupt_error("pickle: stack underflow");
    const auto v = stack_.back();
    stack_.pop_back();
    return v;
  }
  std::uint32_t& top() {
    if (stack_.empty() || (!marks_.empty() && marks_.back() == stack_.size()))
      throw corrupt_error("pickle: stack underflow");
    return stack_.back();
  }
  std::vector<std::uint32_t> pop_mark() {
    if (marks_.empty()) throw corrupt_error("pickle: no mark");
    const auto at = marks_.back();
    marks_.pop_back();
    std::vector<std::uint32_t> items(stack_.begin() + std::ptrdiff_t(at), stack_.end());
    stack_.resize(at);
    return items;
  }
  void memo_put(std::uint64_t idx) {
    if (memo_.size() >= lim_.max_nodes && !memo_.contains(idx))
      throw corrupt_error("pickle: memo too large");
    memo_[idx] = top();
  }
  void memo_get(std::uint64_t idx) {
    const auto it = memo_.find(idx);
    if (it == memo_.end()) throw corrupt_error("pickle: memo miss");
    push(it->second);
  }
  std::uint32_t container(kind k, std::vector<std::uint32_t> items) {
    charge(items.size());
    const auto n = make(k);
    nodes_[n].items = std::move(items);
    return n;
  }

  static std::int64_t parse_decimal(std::string_view s) {
    if (!s.empty() && s.back() == 'L') s.remove_suffix(1);  // protocol-0 LONG
    if (!s.empty() && s.front() == '+') s.remove_prefix(1);
    std::int64_t v = 0;
    const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
    if (r.ec != std::errc() || r.ptr != s.data() + s.size())
      throw corrupt_error("pickle: bad decimal");
    return v;
  }

  // Little-endian two's-complement integer of n bytes (LONG1/LONG4).
  std::uint32_t make_long(std::span<const std::byte> b) {
    if (b.empty()) return make_int(0);
    if (b.size() > 8) return make_int(0, true);
    std::uint64_t u = 0;
    for (std::size_t k = 0; k < b.size(); ++k) u |= std::uint64_t(b[k]) << (8 * k);
    if (b.size() < 8 && (std::to_integer<unsigned>(b.back()) & 0x80u))
      u |= ~std::uint64_t(0) << (8 * b.size());
    return make_int(std::int64_t(u));
  }

  // ---- calls ------------------------------------------------------------------------------
  bool is_global(std::uint32_t n, std::string_view module, std::string_view name_prefix) const {
    const auto& v = nodes_[n];
    if (v.k != kind::global) return false;
    const auto nl = v.s.find('\n');
    return std::string_view(v.s).substr(0, nl) == module &&
           std::string_view(v.s).substr(nl + 1).starts_with(name_prefix);
  }

  const node* as(std::uint32_t n, kind k) const { return nodes_[n].k == k ? &nodes_[n] : nullptr; }

  std::optional<std::vector<std::int64_t>> int_tuple(std::uint32_t n) const {
    const auto* t = as(n, kind::tuple);
    if (!t) t = as(n, kind::list);
    if (!t || t->items.size() > 64) return std::nullopt;
    std::vector<std::int64_t> out;
    for (const auto c : t->items) {
      const auto* v = as(c, kind::integer);
      if (!v || v->big || v->i < 0) return std::nullopt;
      out.push_back(v->i);
    }
    return out;
  }

  // Never holds a pointer into nodes_ across make(): the arena may reallocate.
  std::uint32_t call(std::uint32_t callee, std::uint32_t args) {
    const bool is_tuple = nodes_[args].k == kind::tuple;
    const std::vector<std::uint32_t> a = is_tuple ? nodes_[args].items : std::vector{args};
    if (is_tuple && (is_global(callee, "torch._utils", "_rebuild_tensor") ||
                     is_global(callee, "torch._utils", "_rebuild_qtensor"))) {
      // (storage, storage_offset, size, stride, ...)
      if (a.size() >= 4 && as(a[0], kind::storage) && as(a[1], kind::integer) &&
          !nodes_[a[1]].big) {
        const auto storage = nodes_[a[0]].i;
        const auto offset = nodes_[a[1]].i;
        auto size = int_tuple(a[2]);
        auto stride = int_tuple(a[3]);
        if (size && stride && size->size() == stride->size()) {
          bool contiguous = true;
          std::int64_t expect = 1;
          for (std::size_t d = size->size(); d-- > 0;) {
            if ((*size)[d] != 1 && (*stride)[d] != expect) contiguous = false;
            if ((*size)[d] != 0 && expect > std::numeric_limits<std::int64_t>::max() / (*size)[d])
              contiguous = false;
            else
              expect *= (*size)[d];
          }
          const auto t = make(kind::tensor);
          nodes_[t].i = storage;
          nodes_[t].offset = offset;
          nodes_[t].contiguous = contiguous;
          nodes_[t].dims = std::move(*size);
          return t;
        }
      }
    }
    if (is_tuple && !a.empty() && is_global(callee, "torch._utils", "_rebuild_parameter"))
      return a[0];  // the data tensor
    if (is_tuple && a.empty() && is_global(callee, "collections", "OrderedDict"))
      return make(kind::dict);
    // Anything else: an inert object whose children are the arguments (so tensors inside, e.g.
    // in a whole pickled nn.Module, are still found and named).
    charge(a.size());
    const auto o = make(kind::object);
    nodes_[o].items = a;
    nodes_[o].cls = callee;
    return o;
  }

  // GLOBAL's and INST's module and name lines, capped as STACK_GLOBAL's strings are.
  std::uint32_t global_from_lines() {
    std::string s(take_line());
    s += '\n';
    s += take_line();
    if (s.size() > 4097) throw corrupt_error("pickle: GLOBAL name too long");
    return make_str(kind::global, s);
  }

  // An inert object of class `cls` over `args`.
  std::uint32_t new_object(std::uint32_t cls, std::uint32_t args) {
    std::vector<std::uint32_t> a =
        nodes_[args].k == kind::tuple ? nodes_[args].items : std::vector{args};
    const auto o = container(kind::object, std::move(a));
    nodes_[o].cls = cls;
    return o;
  }

  void add_child(std::uint32_t target, std::uint32_t v) {
    charge(1);
    auto& t = nodes_[target];
    if (t.k == kind::list || t.k == kind::set || t.k == kind::object) {
      t.items.push_back(v);
      return;
    }
    throw corrupt_error("pickle: append to a non-container");
  }
  void set_item(std::uint32_t target, std::uint32_t k, std::uint32_t v) {
    charge(2);
    auto& t = nodes_[target];
    if (t.k == kind::dict) {
      t.items.push_back(k);
      t.items.push_back(v);
    } else if (t.k == kind::object) {
      t.items.push_back(v);
    } else {
      throw corrupt_error("pickle: setitem on a non-dict");
    }
  }

  void persistent_id(std::uint32_t pid) {
    const auto* t = as(pid, kind::tuple);
    if (!t || t->items.size() < 5 || !as(t->items[0], kind::string) ||
        nodes_[t->items[0]].s != "storage") {
      push(make(kind::opaque));
      return;
    }
    const auto& type = nodes_[t->items[1]];
    const auto& key = nodes_[t->items[2]];
    const auto& loc = nodes_[t->items[3]];
    const auto* numel = as(t->items[4], kind::integer);
    if (type.k != kind::global || (key.k != kind::string && key.k != kind::integer) || !numel ||
        numel->big || numel->i < 0)
      throw corrupt_error("pickle: malformed storage persistent id");
    if (type.s.size() > 1024 || key.s.size() > 1024 || loc.s.size() > 1024)
      throw corrupt_error("pickle: storage persistent id strings too long");
    const std::string key_s = key.k == kind::string ? key.s : std::to_string(key.i);
    const std::string type_s = type.s.substr(type.s.find('\n') + 1);
    auto [it, fresh] = storage_index_.try_emplace(key_s, result_.storages.size());
    if (fresh) {
      if (result_.storages.size() >= lim_.max_storages) throw corrupt_error("pickle: storages");
      result_.storages.push_back({key_s,
                                  type_s,
                                  loc.k == kind::string ? loc.s : std::string(),
                                  std::uint64_t(numel->i),
                                  {},
                                  {}});
    } else {
      const auto& s = result_.storages[it->second];
      if (s.type_name != type_s || s.numel != std::uint64_t(numel->i))
        throw corrupt_error("pickle: storage " + key_s + " declared twice differently");
    }
    const auto n = make(kind::storage);
    nodes_[n].i = std::int64_t(it->second);
    push(n);
  }

  // ---- the opcode table -------------------------------------------------------------------
  void step(unsigned op) {
    switch (op) {
      case 0x80: {  // PROTO
        const auto v = std::to_integer<int>(take(1)[0]);
        if (v > 5) throw corrupt_error("pickle: protocol " + std::to_string(v));
        result_.protocol = v;
        break;
      }
      case 0x95:
        take_le<std::uint64_t>();
        break;  // FRAME: framing only
      case '(':
        if (stack_.size() + marks_.size() >= lim_.max_stack) throw corrupt_error("pickle: deep");
        marks_.push_back(stack_.size());
        break;
      case '0':
        pop();
        break;  // POP
      case '1':
        pop_mark();
        break;  // POP_MARK
      case '2':
        push(top());
        break;  // DUP
      case 'N':
        push(make(kind::none));
        break;      // NONE
      case 0x88:    // NEWTRUE
      case 0x89: {  // NEWFALSE
        const auto n = make(kind::boolean);
        nodes_[n].i = op == 0x88;
        push(n);
        break;
      }
      case 'I': {  // INT (text); "00"/"01" are False/True
        const auto line = take_line();
        push(make_int(parse_decimal(line)));
        break;
      }
      case 'J':
        push(make_int(take_le<std::int32_t>()));
        break;  // BININT
      case 'K':
        push(make_int(take_le<std::uint8_t>()));
        break;  // BININT1
      case 'M':
        push(make_int(take_le<std::uint16_t>()));
        break;     // BININT2
      case 'L': {  // LONG (text)
        const auto line = take_line();
        std::int64_t v = 0;
        bool big = false;
        try {
          v = parse_decimal(line);
        } catch (const corrupt_error&) {
          big = true;  // arbitrary precision: kept as an opaque big integer
        }
        push(make_int(v, big));
        break;
      }
      case 0x8a:
        push(make_long(take(take_le<std::uint8_t>())));
        break;      // LONG1
      case 0x8b: {  // LONG4
        const auto n = take_le<std::int32_t>();
        if (n < 0) throw corrupt_error("pickle: negative LONG4 length");
        push(make_long(take(std::size_t(n))));
        break;
      }
      case 'F':
        take_line();
        push(make(kind::floating));
        break;  // FLOAT (text)
      case 'G':
        take(8);
        push(make(kind::floating));
        break;     // BINFLOAT
      case 'S': {  // STRING (quoted, text)
        auto line = take_line();
        if (line.size() >= 2 && (line.front() == '\'' || line.front() == '"'))
          line = line.substr(1, line.size() - 2);
        push(make_str(kind::string, line));
        break;
      }
      case 'T': {  // BINSTRING
        const auto n = take_le<std::int32_t>();
        if (n < 0) throw corrupt_error("pickle: negative BINSTRING length");
        push(make_str(kind::string, take_str(std::uint64_t(n))));
        break;
      }
      case 'U':
        push(make_str(kind::string, take_str(take_le<std::uint8_t>())));
        break;
      case 'V':
        push(make_str(kind::string, take_line()));
        break;  // UNICODE (raw escape)
      case 0x8c:
        push(make_str(kind::string, take_str(take_le<std::uint8_t>())));
        break;
      case 'X':
        push(make_str(kind::string, take_str(take_le<std::uint32_t>())));
        break;
      case 0x8d:
        push(make_str(kind::string, take_str(take_le<std::uint64_t>())));
        break;
      case 'C':
        take_str(take_le<std::uint8_t>());
        push(make(kind::bytes));
        break;
      case 'B':
        take_str(take_le<std::uint32_t>());
        push(make(kind::bytes));
        break;
      case 0x8e:  // BINBYTES8
      case 0x96:  // BYTEARRAY8
        take_str(take_le<std::uint64_t>());
        push(make(kind::bytes));
        break;
      case 0x97:
        push(make(kind::opaque));
        break;  // NEXT_BUFFER (out-of-band)
      case 0x98:
        top();
        break;  // READONLY_BUFFER: no stack change
      case ']':
        push(make(kind::list));
        break;
      case ')':
        push(make(kind::tuple));
        break;
      case '}':
        push(make(kind::dict));
        break;
      case 0x8f:
        push(make(kind::set));
        break;
      case 'l':
        push(container(kind::list, pop_mark()));
        break;  // LIST
      case 't':
        push(container(kind::tuple, pop_mark()));
        break;  // TUPLE
      case 0x91:
        push(container(kind::set, pop_mark()));
        break;    // FROZENSET
      case 0x85:  // TUPLE1..3
      case 0x86:
      case 0x87: {
        const std::size_t n = op - 0x84;
        std::vector<std::uint32_t> items(n);
        for (std::size_t k = n; k-- > 0;) items[k] = pop();
        push(container(kind::tuple, std::move(items)));
        break;
      }
      case 'd': {  // DICT
        auto items = pop_mark();
        if (items.size() % 2) throw corrupt_error("pickle: odd DICT");
        push(container(kind::dict, std::move(items)));
        break;
      }
      case 'a': {  // APPEND
        const auto v = pop();
        add_child(top(), v);
        break;
      }
      case 'e':     // APPENDS
      case 0x90: {  // ADDITEMS
        auto items = pop_mark();
        const auto t = top();
        for (const auto v : items) add_child(t, v);
        break;
      }
      case 's': {  // SETITEM
        const auto v = pop();
        const auto k = pop();
        set_item(top(), k, v);
        break;
      }
      case 'u': {  // SETITEMS
        auto items = pop_mark();
        if (items.size() % 2) throw corrupt_error("pickle: odd SETITEMS");
        const auto t = top();
        for (std::size_t k = 0; k < items.size(); k += 2) set_item(t, items[k], items[k + 1]);
        break;
      }
      case 'g':
        memo_get(std::uint64_t(parse_decimal(take_line())));
        break;  // GET
      case 'h':
        memo_get(take_le<std::uint8_t>());
        break;  // BINGET
      case 'j':
        memo_get(take_le<std::uint32_t>());
        break;  // LONG_BINGET
      case 'p':
        memo_put(std::uint64_t(parse_decimal(take_line())));
        break;  // PUT
      case 'q':
        memo_put(take_le<std::uint8_t>());
        break;  // BINPUT
      case 'r':
        memo_put(take_le<std::uint32_t>());
        break;  // LONG_BINPUT
      case 0x94:
        memo_put(memo_.size());
        break;  // MEMOIZE
      case 0x82:
        take(1);
        push(make(kind::opaque));
        break;  // EXT1
      case 0x83:
        take(2);
        push(make(kind::opaque));
        break;  // EXT2
      case 0x84:
        take(4);
        push(make(kind::opaque));
        break;   // EXT4
      case 'c':  // GLOBAL
        push(global_from_lines());
        break;
      case 0x93: {  // STACK_GLOBAL
        const auto n = pop();
        const auto m = pop();
        if (!as(n, kind::string) || !as(m, kind::string))
          throw corrupt_error("pickle: STACK_GLOBAL of non-strings");
        if (nodes_[m].s.size() + nodes_[n].s.size() > 4096)
          throw corrupt_error("pickle: STACK_GLOBAL name too long");
        push(make_str(kind::global, nodes_[m].s + '\n' + nodes_[n].s));
        break;
      }
      case 'R': {  // REDUCE
        const auto args = pop();
        const auto callee = pop();
        push(call(callee, args));
        break;
      }
      case 0x81: {  // NEWOBJ: the class's own __new__, never a torch rebuild function
        const auto args = pop();
        push(new_object(pop(), args));
        break;
      }
      case 0x92: {  // NEWOBJ_EX
        pop();      // kwargs
        const auto args = pop();
        push(new_object(pop(), args));
        break;
      }
      case 'i': {  // INST: module and name lines, then arguments since the mark
        const auto cls = global_from_lines();
        const auto o = container(kind::object, pop_mark());
        nodes_[o].cls = cls;
        push(o);
        break;
      }
      case 'o': {  // OBJ: class and arguments since the mark
        auto items = pop_mark();
        if (items.empty()) throw corrupt_error("pickle: OBJ without class");
        const auto cls = items.front();
        items.erase(items.begin());
        const auto o = container(kind::object, std::move(items));
        nodes_[o].cls = cls;
        push(o);
        break;
      }
      case 'b': {  // BUILD
        const auto state = pop();
        const auto t = top();
        if (nodes_[t].k == kind::dict && nodes_[state].k == kind::dict) {
          const auto extra = nodes_[state].items;  // copy: may alias
          charge(extra.size());
          for (const auto v : extra) nodes_[t].items.push_back(v);
        } else if (nodes_[t].k == kind::object) {
          nodes_[t].items.push_back(state);
        } else if (nodes_[t].k == kind::tensor || nodes_[t].k == kind::storage) {
          // tensor subclass state: nothing to learn
        } else {
          const auto o = make(kind::object);
          nodes_[o].items = {t, state};
          stack_.back() = o;
        }
        break;
      }
      case 'P':
        push(make(kind::opaque));
        take_line();
        break;  // PERSID (text): not torch's
      case 'Q':
        persistent_id(pop());
        break;  // BINPERSID
      default:
        throw corrupt_error("pickle: unknown opcode " + std::to_string(op));
    }
  }

  // ---- naming -----------------------------------------------------------------------------
  // Depth-first over the value graph in pickle order; each container is entered once, so the
  // walk is linear even when the memo makes the graph a DAG or a cycle.
  // Paths are a tree of (parent, part) entries materialised only for tensors, so a container
  // with millions of children under a long path costs a few bytes per child, not a string each.
  struct path_entry {
    std::uint32_t parent;  // npos: the root
    std::uint32_t key;     // dict: key node; list/tuple/set: element index
    bool is_index;
  };
  static constexpr std::uint32_t npos = 0xffffffffu;

  std::string path_of(const std::vector<path_entry>& paths, std::uint32_t at) const {
    std::vector<std::string> parts;
    for (; at != npos; at = paths[at].parent) {
      const auto& e = paths[at];
      if (e.is_index) {
        parts.push_back(std::to_string(e.key));
        continue;
      }
      const auto& key = nodes_[e.key];
      std::string part = key.k == kind::string    ? key.s.substr(0, 256)
                         : key.k == kind::integer ? std::to_string(key.i)
                                                  : std::string("?");
      parts.push_back(std::move(part));
    }
    std::string out;
    for (auto it = parts.rbegin(); it != parts.rend(); ++it) out += (out.empty() ? "" : ".") + *it;
    return out;
  }

  void name_tensors(std::uint32_t root) {
    std::vector<bool> seen(nodes_.size());
    std::vector<path_entry> paths;
    struct frame {
      std::uint32_t n;
      std::uint32_t path;
      std::uint32_t depth;
    };
    std::vector<frame> todo{{root, npos, 0}};
    std::size_t name_bytes = 0;  // all names together stay under a budget
    while (!todo.empty()) {
      const auto f = todo.back();
      todo.pop_back();
      const auto& v = nodes_[f.n];
      if (v.k == kind::tensor) {
        auto& s = result_.storages[std::size_t(v.i)];
        if (s.names.size() < 64 && name_bytes < lim_.max_name_bytes) {
          std::string nm = f.path == npos ? "data/" + s.key : path_of(paths, f.path);
          name_bytes += nm.size();
          s.names.push_back(std::move(nm));
        }
        std::uint64_t numel = 1;
        bool ok = true;
        for (const auto d : v.dims) {
          if (d != 0 && numel > std::numeric_limits<std::uint64_t>::max() / std::uint64_t(d))
            ok = false;
          else
            numel *= std::uint64_t(d);
        }
        if (s.shape.empty() && ok && v.contiguous && v.offset == 0 && numel == s.numel)
          s.shape.assign(v.dims.begin(), v.dims.end());
        continue;
      }
      if (v.k != kind::tuple && v.k != kind::list && v.k != kind::set && v.k != kind::dict &&
          v.k != kind::object)
        continue;
      if (seen[f.n]) continue;
      seen[f.n] = true;
      if (f.depth >= lim_.max_path_depth) continue;
      // Push children in reverse so they pop in order.
      if (v.k == kind::dict) {
        for (std::size_t k = v.items.size(); k >= 2; k -= 2) {
          paths.push_back({f.path, v.items[k - 2], false});
          todo.push_back({v.items[k - 1], std::uint32_t(paths.size() - 1), f.depth + 1});
        }
      } else if (v.k == kind::object) {
        for (std::size_t k = v.items.size(); k-- > 0;)
          todo.push_back({v.items[k], f.path, f.depth + 1});
      } else {
        for (std::size_t k = v.items.size(); k-- > 0;) {
          paths.push_back({f.path, std::uint32_t(k), true});
          todo.push_back({v.items[k], std::uint32_t(paths.size() - 1), f.depth + 1});
        }
      }
    }
  }

  // Every child reference costs memory; the total is capped.
  void charge(std::size_t n) {
    items_ += n;
    if (items_ > lim_.max_items) throw corrupt_error("pickle: too many container items");
  }

  std::span<const std::byte> in_;
  pickle_limits lim_;
  std::size_t pos_ = 0;
  std::vector<node> nodes_;
  std::vector<std::uint32_t> stack_;
  std::vector<std::size_t> marks_;  // stack heights at each MARK
  std::unordered_map<std::uint64_t, std::uint32_t> memo_;
  std::unordered_map<std::string, std::size_t> storage_index_;
  pickle_scan result_;
  std::size_t items_ = 0;
};

}  // namespace

pickle_scan scan_torch_pickle(std::span<const std::byte> pickle, const pickle_limits& limits) {
  if (pickle.size() > limits.max_bytes) throw corrupt_error("pickle: larger than the scan limit");
  return machine(pickle, limits).run();
}

pickle_graph load_pickle_graph(std::span<const std::byte> pickle, const pickle_limits& limits) {
  if (pickle.size() > limits.max_bytes) throw corrupt_error("pickle: larger than the scan limit");
  return machine(pickle, limits).graph();
}

const pickle_graph::node* pickle_graph::get(std::uint32_t dict, std::string_view key) const {
  const auto& d = at(dict);
  if (d.k != kind::dict) return nullptr;
  for (std::size_t k = 0; k + 1 < d.items.size(); k += 2) {
    const auto& key_node = at(d.items[k]);
    if (key_node.k == kind::string && key_node.s == key) return &at(d.items[k + 1]);
  }
  return nullptr;
}

}  // namespace ckpt::format
