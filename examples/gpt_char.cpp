// gpt_char - a GPT-style character-level language model trained on a text file.
//
//   [mpirun -np N] build/examples/gpt_char [--text FILE[,FILE...]] [--steps 2000] [--batch 32] [--context 64]
//       [--layers 4] [--embd 128] [--heads 4] [--dropout 0.0] [--lr 0.001] [--weight-decay 0.1]
//       [--clip 1.0] [--precision fp32|bf16|fp16] [--checkpoint none|sqrt|every:N]
//       [--snapshot-dir DIR [--resume 0|1|auto] [--snapshot-every N]] [--eval-every N] [--sample-chars N]
//
// The default text is what Debian's fortunes-min package ships (/usr/share/games/fortunes:
// fortunes, literature, riddles; about 98 000 characters). The first 90 % of the characters train,
// the last 10 % validate. The model is GPT-2's shape: token and learned position embeddings, then
// --layers blocks of [layer norm, causal multi-head attention, residual] and [layer norm, MLP
// (4x, GELU), residual], a final layer norm and a head that shares the token embedding's weight.
// Each step is one train::train_step on int64 token ids: AdamW with weight decay on the matrices
// only (optim::decay_groups), warmup + cosine, gradient clipping, the precision and recompute
// policies of the command line. The recompute policy splits at the half-blocks (attention and MLP
// are segments of their own), so --checkpoint every:1 keeps only the residual stream between them.
// Every --eval-every steps: the validation loss in nats per character. At the end: a sample of
// --sample-chars characters generated from the trained model. Under mpirun every process is a
// data-parallel rank (parallel::data_parallel over dist::mpi): each takes its own shard of the
// shuffled windows, --batch of them per step, and the gradients are averaged bucket by bucket while
// backward runs; rank 0 prints and writes the snapshots. Without mpirun it is a world of one. benchmarks/gpt_char_pytorch.py
// trains the same model (configuration, data split, initialisation scheme) in PyTorch.
//
// Reading order: gpt (the model) top to bottom, then train<Precision, Recompute>(), then main().
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <memory>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include <trainkit/dist/mpi.hpp>  // dist::mpi: the ranks of a data-parallel job
#include <trainkit/parallel/data_parallel.hpp>
#include <trainkit/train/train.hpp>
#include <trainkit/trainkit.hpp>

#include "common/example.hpp"

TRAINKIT_THREAD_DEFAULTS();

namespace tk = trainkit;
namespace nn = trainkit::nn;
namespace ag = trainkit::autograd;
using tk::index_t;
using var = tk::var<float>;

namespace {

struct gpt_config {
  index_t vocab = 0, context = 64, layers = 4, embd = 128, heads = 4;
  double dropout = 0.0;
};

/// GPT-2's initialisation: weights N(0, 0.02), the residual projections N(0, 0.02 / sqrt(2 layers)),
/// biases 0, layer norms 1 and 0.
void gpt_init(tk::tensor<float> w, double std, tk::generator& g) { nn::init::normal_(w, 0.0, std, g); }

/// x + attention(layer_norm(x)), causal: the first half of a block (one recompute segment).
class attention_half : public nn::module<float> {
 public:
  attention_half(const gpt_config& c, tk::generator& g) {
    ln_ = register_module("ln", std::make_shared<nn::layer_norm<float>>(tk::shape{c.embd}));
    attn_ = register_module("attn", std::make_shared<nn::multi_head_attention<float>>(c.embd, c.heads, c.dropout, true,
                                                                                      /*batch_first=*/true, g));
    gpt_init(attn_->in_proj_weight().value(), 0.02, g);
    gpt_init(attn_->out_proj().weight().value(), 0.02 / std::sqrt(2.0 * double(c.layers)), g);
  }
  var forward(const var& x) override {
    const var h = (*ln_)(x);
    return x + (*attn_)(h, h, h, {.is_causal = true});
  }

 private:
  std::shared_ptr<nn::layer_norm<float>> ln_;
  std::shared_ptr<nn::multi_head_attention<float>> attn_;
};

/// x + dropout(proj(gelu(fc(layer_norm(x))))): the second half of a block.
class mlp_half : public nn::module<float> {
 public:
  mlp_half(const gpt_config& c, tk::generator& g) {
    ln_ = register_module("ln", std::make_shared<nn::layer_norm<float>>(tk::shape{c.embd}));
    fc_ = register_module("fc", std::make_shared<nn::linear<float>>(c.embd, 4 * c.embd, true, g));
    proj_ = register_module("proj", std::make_shared<nn::linear<float>>(4 * c.embd, c.embd, true, g));
    drop_ = register_module("drop", std::make_shared<nn::dropout<float>>(c.dropout, g));
    gpt_init(fc_->weight().value(), 0.02, g);
    gpt_init(proj_->weight().value(), 0.02 / std::sqrt(2.0 * double(c.layers)), g);
    tk::fill_(fc_->bias().value(), 0.0f);
    tk::fill_(proj_->bias().value(), 0.0f);
  }
  var forward(const var& x) override { return x + (*drop_)((*proj_)(ag::gelu((*fc_)((*ln_)(x))))); }

 private:
  std::shared_ptr<nn::layer_norm<float>> ln_;
  std::shared_ptr<nn::linear<float>> fc_, proj_;
  std::shared_ptr<nn::dropout<float>> drop_;
};

/// One transformer block: its two halves, each a recompute segment of its own.
class block : public nn::module<float> {
 public:
  block(const gpt_config& c, tk::generator& g) {
    attn_ = register_module("attn", std::make_shared<attention_half>(c, g));
    mlp_ = register_module("mlp", std::make_shared<mlp_half>(c, g));
  }
  var forward(const var& x) override { return (*mlp_)((*attn_)(x)); }
  nn::module<float>* attn() const { return attn_.get(); }
  nn::module<float>* mlp() const { return mlp_.get(); }

 private:
  std::shared_ptr<attention_half> attn_;
  std::shared_ptr<mlp_half> mlp_;
};

/// layer_norm, then logits = h W_tok^T: the head shares the token embedding's weight (tied; the
/// weight is the embedding's parameter, listed once).
class lm_head : public nn::module<float> {
 public:
  lm_head(const gpt_config& c, var tied) : tied_(std::move(tied)) {
    ln_ = register_module("ln", std::make_shared<nn::layer_norm<float>>(tk::shape{c.embd}));
  }
  var forward(const var& x) override { return ag::linear((*ln_)(x), tied_); }

 private:
  std::shared_ptr<nn::layer_norm<float>> ln_;
  var tied_;
};

/// The language model: forward(ids [B, T]) -> logits [B, T, vocab]. It names its segments after
/// embed() (checkpoint::segmented_token_module), so train_step can recompute half-blocks.
class gpt : public nn::module<float> {
 public:
  explicit gpt(const gpt_config& c, tk::generator& g) : c_(c) {
    tok_ = register_module("tok", std::make_shared<nn::embedding<float>>(c.vocab, c.embd, g));
    pos_ = &register_parameter("pos", tk::tensor<float>::empty({c.context, c.embd}));
    drop_ = register_module("drop", std::make_shared<nn::dropout<float>>(c.dropout, g));
    gpt_init(tok_->weight().value(), 0.02, g);
    gpt_init(pos_->value(), 0.02, g);
    for (index_t l = 0; l < c.layers; ++l)
      blocks_.push_back(register_module("h" + std::to_string(l), std::make_shared<block>(c, g)));
    head_ = register_module("head", std::make_shared<lm_head>(c, tok_->weight()));
  }

  using nn::module<float>::forward;
  /// Token + position embeddings of ids [B, T] (T <= context), [B, T, embd].
  var embed(const tk::tensor<std::int64_t>& ids) {
    TRAINKIT_CHECK(ids.dim() == 2 && ids.size(1) <= c_.context, tk::shape_error, "gpt",
                   "expected token ids [batch, T <= " << c_.context << "], got " << tk::to_string(ids.sizes()));
    return (*drop_)((*tok_)(ids) + ag::slice(*pos_, 0, 0, ids.size(1)));
  }
  std::vector<nn::module<float>*> segments() {
    std::vector<nn::module<float>*> s;
    for (auto& b : blocks_) s.insert(s.end(), {b->attn(), b->mlp()});  // boundaries inside each block
    s.push_back(head_.get());
    return s;
  }
  var forward(const tk::tensor<std::int64_t>& ids) {
    var h = embed(ids);
    for (auto* m : segments()) h = m->forward(h);
    return h;
  }
  const gpt_config& config() const noexcept { return c_; }

 private:
  gpt_config c_;
  std::shared_ptr<nn::embedding<float>> tok_;
  var* pos_ = nullptr;
  std::shared_ptr<nn::dropout<float>> drop_;
  std::vector<std::shared_ptr<block>> blocks_;
  std::shared_ptr<lm_head> head_;
};

/// The loss of logits [B, T, V] against the next tokens [B, T]: mean cross-entropy per token.
var next_token_loss(const var& logits, const tk::tensor<std::int64_t>& y) {
  return ag::cross_entropy(ag::reshape(logits, {-1, logits.size(-1)}), y.reshape({-1}));
}

/// n characters sampled from the model after `prompt`, temperature 0.8, from gen's uniform stream.
std::string generate(gpt& model, const tk::data::char_vocabulary& vocab, const std::string& prompt, index_t n,
                     tk::generator& gen) {
  ag::no_grad ng;
  const bool was_training = model.is_training();
  model.eval();
  std::vector<std::int64_t> ids;
  for (char ch : prompt) ids.push_back(vocab.id(ch));
  std::string out;
  for (index_t i = 0; i < n; ++i) {
    const index_t t = std::min<index_t>(index_t(ids.size()), model.config().context);
    auto x = tk::tensor<std::int64_t>::empty({1, t});
    std::copy(ids.end() - t, ids.end(), x.data());
    const auto logits = model.forward(x).value().slice(1, t - 1, t).contiguous();  // [1, 1, V]
    std::vector<double> p(std::size_t(vocab.size()));
    double mx = -INFINITY, sum = 0;
    for (std::size_t k = 0; k < p.size(); ++k) mx = std::max(mx, double(logits.data()[k]) / 0.8);
    for (std::size_t k = 0; k < p.size(); ++k) sum += (p[k] = std::exp(double(logits.data()[k]) / 0.8 - mx));
    double u = tk::uniform_double_at(gen.seed(), gen.reserve(2), 0) * sum;
    std::size_t k = 0;
    while (k + 1 < p.size() && (u -= p[k]) > 0) ++k;
    ids.push_back(std::int64_t(k));
    out.push_back(vocab.symbol(std::int64_t(k)));
  }
  model.train(was_training);
  return out;
}

/// The text of --text: the files joined, in order.
std::string read_texts(const std::string& list) {
  std::string text, path;
  std::istringstream s(list);
  while (std::getline(s, path, ','))
    if (!path.empty()) text += tk::data::read_text_file(path);
  TRAINKIT_CHECK(text.size() > 1000, tk::value_error, "gpt_char",
                 "--text '" << list << "' holds " << text.size() << " characters; at least 1000 are needed");
  return text;
}

template <class Precision, class Recompute>
int train(tk::dist::mpi& comm, const example::flags& f, Recompute recompute) {
  const int rank = comm.rank(), world = comm.size();
  auto say = [&](const char* fmt, auto... args) { example::say(rank, fmt, args...); };  // rank 0 speaks for all
  const auto seed = static_cast<std::uint64_t>(f.num("seed", 0));
  const index_t steps = f.num("steps", 1), batch = f.num("batch", 1), eval_every = f.num("eval-every", 1);
  const double lr = f.real("lr", 0), weight_decay = f.real("weight-decay", 0), clip = f.real("clip", 0);
  const index_t snapshot_every = f.num("snapshot-every", 0), sample_chars = f.num("sample-chars", 0);
  const index_t stop_after = f.num("stop-after", 0);  // steps of this run, then stop as on a signal
  gpt_config c;
  c.context = f.num("context", 1), c.layers = f.num("layers", 1), c.embd = f.num("embd", 1);
  c.heads = f.num("heads", 1), c.dropout = f.real("dropout", 0, 1);
  tk::set_seed(seed);

  // Data: characters as ids; the first 90 % train (windows at every offset, shuffled), the last
  // 10 % validate (windows side by side).
  const std::string text = read_texts(f.str("text"));
  const tk::data::char_vocabulary vocab(text);
  c.vocab = vocab.size();
  const auto ids = vocab.encode(text);
  const index_t split = ids.numel() * 9 / 10;
  const tk::data::token_windows train_set(ids.slice(0, 0, split), c.context, 1);
  const tk::data::token_windows val_set(ids.slice(0, split, ids.numel()), c.context);
  say("text: %zu characters, vocabulary %lld; train %lld, validation %lld characters\n", text.size(),
      (long long)c.vocab, (long long)split, (long long)(ids.numel() - split));
  // Every rank shuffles alike and takes every world-th window from its rank on (its shard).
  tk::data::distributed_sampler shard(train_set.size(),
                                      {.num_replicas = world, .rank = rank, .seed = seed, .drop_last = true});
  tk::data::data_loader batches(train_set, shard, {.batch_size = batch, .num_workers = 1, .drop_last = true});
  tk::data::data_loader val_batches(val_set, tk::data::sequential_sampler(val_set.size()), {.batch_size = 64});

  // The model: the same initialisation on every rank (data_parallel checks it and broadcasts rank
  // 0's); then its generator, which the dropout layers draw from, goes on per rank.
  tk::generator gen(seed);
  gpt model(c, gen);
  tk::parallel::data_parallel<tk::dist::mpi, tk::compression::none, float, tk::cpu> ddp(comm, model);
  gen.set_state(seed * 1000 + std::uint64_t(rank), 0);
  say("model: %lld layers, %lld embedding, %lld heads, context %lld; %lld parameters; %d rank(s) x batch %lld\n",
      (long long)c.layers, (long long)c.embd, (long long)c.heads, (long long)c.context,
      (long long)model.num_parameters(), world, (long long)batch);
  say("%s\n", example::threads_line().c_str());

  tk::optim::adamw opt(tk::optim::decay_groups(model.named_parameters(), weight_decay),
                       {.lr = lr, .beta2 = 0.99, .weight_decay = weight_decay});
  tk::optim::warmup_cosine_lr schedule(
      {.base_lr = lr, .warmup_steps = std::min<index_t>(100, steps / 10), .total_steps = steps, .min_lr = lr / 10});
  schedule.apply(opt);
  using scaler_t = tk::amp::default_scaler_t<Precision>;
  tk::train::train_step<gpt, decltype(opt), Precision, scaler_t, Recompute, decltype(ddp)> step(
      model, opt, ddp, {.max_grad_norm = clip}, scaler_t(), recompute);
  step.attach_schedule(schedule);

  tk::io::resumable_run run({.dir = f.str("snapshot-dir"),
                             .resume = example::resume_flag(f),
                             .config = {{"model", example::signature(model)}, {"batch", f.str("batch")},
                                        {"seed", f.str("seed")}, {"lr", f.str("lr")}, {"steps", f.str("steps")},
                                        {"precision", f.str("precision")}, {"text", f.str("text")}},
                             .every_steps = snapshot_every,
                             .rank = rank, .world_size = world, .any_rank = tk::io::any_rank_of(comm),
                             .allgather_bytes = tk::io::allgather_bytes_of(comm)},
                            /*include_default_generator=*/false);
  run.track("model", model).track("optimizer", opt).track("schedule", schedule).track("scaler", step.scaler())
      .track("batches", batches);
  run.track_per_rank("rng.dropout", gen);
  run.resume();
  const std::int64_t first_step = run.step();

  auto validate = [&] {
    val_batches.set_epoch(0);
    return tk::train::evaluate(model, val_batches, [](const var& logits, const auto& y) {
      return ag::cross_entropy(logits, y);
    }, tk::amp::module_forward<Precision>{});
  };
  example::stopwatch clock;
  std::vector<double> step_seconds;  // train_step's own time per step, for the median at the end
  double loss_sum = 0;
  index_t since = 0;
  while (run.step() < steps) {
    if (!batches.has_next()) batches.set_epoch(batches.epoch() + 1);
    const auto b = batches.next();
    const auto r = step(b.x, [&](const var& logits) { return next_token_loss(logits, b.y); });
    loss_sum += r.loss / world, ++since;
    if (stop_after > 0 && run.step() + 1 - first_step == stop_after) run.request_stop();  // on every rank
    step_seconds.push_back(r.seconds);
    const bool stop = run.step_done();
    const auto k = index_t(run.step());
    if (k % eval_every == 0 || k == steps) {
      comm.allreduce(&loss_sum, 1, tk::dist::reduce_op::sum).wait();  // the mean over all ranks' batches
      const auto v = validate();  // every rank holds the same model: the same figures
      say("step %lld  train loss %.4f  val loss %.4f nats/char  val accuracy %.1f%%  %.0f chars/s\n", (long long)k,
          loss_sum / double(since), v.mean_loss(), 100 * v.accuracy(),
          double(since * batch * c.context * world) / clock.seconds());
      loss_sum = 0, since = 0, clock = example::stopwatch();
    }
    if (stop) {
      say("stopped  parameters digest %016llx\n", (unsigned long long)example::digest(model));
      return example::exit_restart;
    }
  }
  run.finish();
  if (step_seconds.size() >= 10) {  // the first tenth (warm-up: allocations, route measurements) left out
    std::vector<double> late(step_seconds.begin() + std::ptrdiff_t(step_seconds.size() / 10), step_seconds.end());
    std::nth_element(late.begin(), late.begin() + std::ptrdiff_t(late.size() / 2), late.end());
    say("median step %.2f ms, peak tensor memory %.1f MiB\n", 1e3 * late[late.size() / 2],
        double(tk::allocator<tk::cpu>::stats().peak) / (1 << 20));
  }
  if (sample_chars > 0 && rank == 0) {
    tk::generator sample_gen(seed + 1);
    say("sample:\n%s\n", generate(model, vocab, "\n", sample_chars, sample_gen).c_str());
  }
  if (const std::string w = example::wait_line(); !w.empty()) say("%s\n", w.c_str());
  say("done  parameters digest %016llx\n", (unsigned long long)example::digest(model));
  return 0;
}

template <class Precision>
int train_recompute(tk::dist::mpi& comm, const example::flags& f, const tk::checkpoint::recompute_choice& r) {
  namespace ck = tk::checkpoint;
  switch (r.index()) {
    case 0: return train<Precision>(comm, f, std::get<ck::store_all>(r));
    case 1: return train<Precision>(comm, f, std::get<ck::sqrt_segments>(r));
    default: return train<Precision>(comm, f, std::get<ck::every_n>(r));
  }
}

/// The job on this rank. An error is printed first: a failed peer (dist_error, naming it) exits
/// 75, worth restarting; this rank's own error (a bad flag, an unreadable --text) ends every rank
/// now instead of leaving them in their next collective until the timeout.
int job(int argc, char** argv) {
  tk::io::catch_stop_signals_early();  // a stop while MPI starts is still a snapshot and 75
  tk::dist::mpi::environment env(argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  try {
    example::flags f(argc, argv,
                     {{"text", "/usr/share/games/fortunes/fortunes,/usr/share/games/fortunes/literature,"
                               "/usr/share/games/fortunes/riddles"},
                      {"steps", "2000"}, {"batch", "32"}, {"context", "64"}, {"layers", "4"}, {"embd", "128"},
                      {"heads", "4"}, {"dropout", "0"}, {"lr", "0.001"}, {"weight-decay", "0.1"}, {"clip", "1"},
                      {"seed", "1"}, {"precision", "fp32"}, {"checkpoint", "none"}, {"snapshot-dir", ""},
                      {"resume", "0"}, {"snapshot-every", "500"}, {"stop-after", "0"}, {"eval-every", "250"},
                      {"sample-chars", "300"}});
    tk::dist::mpi comm;
    const auto recompute = tk::checkpoint::parse_recompute(f.str("checkpoint"));
    switch (tk::amp::parse_precision(f.str("precision"))) {
      case tk::amp::precision_kind::fp32: return train_recompute<tk::amp::fp32>(comm, f, recompute);
      case tk::amp::precision_kind::fp16: return train_recompute<tk::amp::mixed_fp16>(comm, f, recompute);
      case tk::amp::precision_kind::bf16: return train_recompute<tk::amp::mixed_bf16>(comm, f, recompute);
    }
    return 1;
  } catch (const tk::dist::dist_error& e) {
    std::fprintf(stderr, "gpt_char: rank %d: %s\n", rank, e.what());
    return example::exit_restart;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt_char: rank %d: %s\n", rank, e.what());
    std::fflush(stderr);
    tk::dist::abort_job(1);
  }
}

}  // namespace

int main(int argc, char** argv) { return job(argc, argv); }
