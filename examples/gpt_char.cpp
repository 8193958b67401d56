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
// backward runs; rank 0 prints and writes the snapshots. Without mpirun it is a world of one.
// benchmarks/gpt_char_pytorch.py trains the same model (configuration, data split, initialisation
// scheme) in PyTorch.
//
// Reading order: example::gpt (the model) top to bottom, then train<Device, Memory, Precision>()
// (the whole job), then main().
//
// The model and the job are reused, not copied: gpt_char.cu (gpt_char_cuda, the same job on GPUs,
// gradients over NCCL) includes this file with GPT_CHAR_JOB_ONLY defined, which leaves out the CPU
// main(); bench_cuda_train_step times the model with GPT_CHAR_MODEL_ONLY (the model only).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <trainkit/trainkit.hpp>

namespace example {

namespace tk = trainkit;
namespace nn = trainkit::nn;
namespace ag = trainkit::autograd;

struct gpt_config {
  tk::index_t vocab = 0, context = 64, layers = 4, embd = 128, heads = 4;
  double dropout = 0.0;
};

/// GPT-2's initialisation: weights N(0, 0.02), the residual projections N(0, 0.02 / sqrt(2 layers)),
/// biases 0, layer norms 1 and 0. Drawn on the host (nn::init), so a GPU model starts from the
/// CPU model's values.
template <class Device>
void gpt_init(tk::tensor<float, Device> w, double std, tk::generator& g) {
  nn::init::normal_(w, 0.0, std, g);
}

/// x + attention(layer_norm(x)), causal: the first half of a block (one recompute segment).
template <class Device = tk::cpu>
class attention_half : public nn::module<float, Device> {
 public:
  using var = tk::var<float, Device>;
  attention_half(const gpt_config& c, tk::generator& g) {
    ln_ = this->register_module("ln", std::make_shared<nn::layer_norm<float, Device>>(tk::shape{c.embd}));
    attn_ = this->register_module("attn", std::make_shared<nn::multi_head_attention<float, Device>>(
                                              c.embd, c.heads, c.dropout, true, /*batch_first=*/true, g));
    gpt_init(attn_->in_proj_weight().value(), 0.02, g);
    gpt_init(attn_->out_proj().weight().value(), 0.02 / std::sqrt(2.0 * double(c.layers)), g);
  }
  var forward(const var& x) override {
    const var h = (*ln_)(x);
    return x + (*attn_)(h, h, h, {.is_causal = true});
  }

 private:
  std::shared_ptr<nn::layer_norm<float, Device>> ln_;
  std::shared_ptr<nn::multi_head_attention<float, Device>> attn_;
};

/// x + dropout(proj(gelu(fc(layer_norm(x))))): the second half of a block.
template <class Device = tk::cpu>
class mlp_half : public nn::module<float, Device> {
 public:
  using var = tk::var<float, Device>;
  mlp_half(const gpt_config& c, tk::generator& g) {
    ln_ = this->register_module("ln", std::make_shared<nn::layer_norm<float, Device>>(tk::shape{c.embd}));
    fc_ = this->register_module("fc", std::make_shared<nn::linear<float, Device>>(c.embd, 4 * c.embd, true, g));
    proj_ = this->register_module("proj", std::make_shared<nn::linear<float, Device>>(4 * c.embd, c.embd, true, g));
    drop_ = this->register_module("drop", std::make_shared<nn::dropout<float, Device>>(c.dropout, g));
    gpt_init(fc_->weight().value(), 0.02, g);
    gpt_init(proj_->weight().value(), 0.02 / std::sqrt(2.0 * double(c.layers)), g);
    tk::fill_(fc_->bias().value(), 0.0f);
    tk::fill_(proj_->bias().value(), 0.0f);
  }
  var forward(const var& x) override { return x + (*drop_)((*proj_)(ag::gelu((*fc_)((*ln_)(x))))); }

 private:
  std::shared_ptr<nn::layer_norm<float, Device>> ln_;
  std::shared_ptr<nn::linear<float, Device>> fc_, proj_;
  std::shared_ptr<nn::dropout<float, Device>> drop_;
};

/// One transformer block: its two halves, each a recompute segment of its own.
template <class Device = tk::cpu>
class block : public nn::module<float, Device> {
 public:
  using var = tk::var<float, Device>;
  block(const gpt_config& c, tk::generator& g) {
    attn_ = this->register_module("attn", std::make_shared<attention_half<Device>>(c, g));
    mlp_ = this->register_module("mlp", std::make_shared<mlp_half<Device>>(c, g));
  }
  var forward(const var& x) override { return (*mlp_)((*attn_)(x)); }
  nn::module<float, Device>* attn() const { return attn_.get(); }
  nn::module<float, Device>* mlp() const { return mlp_.get(); }

 private:
  std::shared_ptr<attention_half<Device>> attn_;
  std::shared_ptr<mlp_half<Device>> mlp_;
};

/// layer_norm, then logits = h W_tok^T: the head shares the token embedding's weight (tied; the
/// weight is the embedding's parameter, listed once).
template <class Device = tk::cpu>
class lm_head : public nn::module<float, Device> {
 public:
  using var = tk::var<float, Device>;
  lm_head(const gpt_config& c, var tied) : tied_(std::move(tied)) {
    ln_ = this->register_module("ln", std::make_shared<nn::layer_norm<float, Device>>(tk::shape{c.embd}));
  }
  var forward(const var& x) override { return ag::linear((*ln_)(x), tied_); }

 private:
  std::shared_ptr<nn::layer_norm<float, Device>> ln_;
  var tied_;
};

/// The language model: forward(ids [B, T]) -> logits [B, T, vocab]. It names its segments after
/// embed() (checkpoint::segmented_token_module), so train_step can recompute half-blocks.
/// \tparam Device trainkit::cpu or trainkit::cuda
template <class Device = tk::cpu>
class gpt : public nn::module<float, Device> {
 public:
  using var = tk::var<float, Device>;
  using ids_type = tk::tensor<std::int64_t, Device>;
  explicit gpt(const gpt_config& c, tk::generator& g) : c_(c) {
    tok_ = this->register_module("tok", std::make_shared<nn::embedding<float, Device>>(c.vocab, c.embd, g));
    pos_ = &this->register_parameter("pos", tk::tensor<float, Device>::empty({c.context, c.embd}));
    drop_ = this->register_module("drop", std::make_shared<nn::dropout<float, Device>>(c.dropout, g));
    gpt_init(tok_->weight().value(), 0.02, g);
    gpt_init(pos_->value(), 0.02, g);
    for (tk::index_t l = 0; l < c.layers; ++l)
      blocks_.push_back(this->register_module("h" + std::to_string(l), std::make_shared<block<Device>>(c, g)));
    head_ = this->register_module("head", std::make_shared<lm_head<Device>>(c, tok_->weight()));
  }

  using nn::module<float, Device>::forward;
  /// Token + position embeddings of ids [B, T] (T <= context), [B, T, embd].
  var embed(const ids_type& ids) {
    TRAINKIT_CHECK(ids.dim() == 2 && ids.size(1) <= c_.context, tk::shape_error, "gpt",
                   "expected token ids [batch, T <= " << c_.context << "], got " << tk::to_string(ids.sizes()));
    return (*drop_)((*tok_)(ids) + ag::slice(*pos_, 0, 0, ids.size(1)));
  }
  std::vector<nn::module<float, Device>*> segments() {
    std::vector<nn::module<float, Device>*> s;
    for (auto& b : blocks_) s.insert(s.end(), {b->attn(), b->mlp()});  // boundaries inside each block
    s.push_back(head_.get());
    return s;
  }
  var forward(const ids_type& ids) {
    var h = embed(ids);
    for (auto* m : segments()) h = m->forward(h);
    return h;
  }
  const gpt_config& config() const noexcept { return c_; }

 private:
  gpt_config c_;
  std::shared_ptr<nn::embedding<float, Device>> tok_;
  var* pos_ = nullptr;
  std::shared_ptr<nn::dropout<float, Device>> drop_;
  std::vector<std::shared_ptr<block<Device>>> blocks_;
  std::shared_ptr<lm_head<Device>> head_;
};

}  // namespace example

#ifndef GPT_CHAR_MODEL_ONLY  // the job (and, without GPT_CHAR_JOB_ONLY, the CPU main())

#include <trainkit/dist/mpi.hpp>  // dist::mpi: the ranks of a data-parallel job
#include <trainkit/parallel/data_parallel.hpp>
#include <trainkit/train/train.hpp>

#include "common/example.hpp"

namespace tk = trainkit;
namespace ag = trainkit::autograd;
using tk::index_t;

namespace {

using example::gpt;
using example::gpt_config;

/// The loss of logits [B, T, V] against the next tokens [B, T]: mean cross-entropy per token.
template <class Device>
tk::var<float, Device> next_token_loss(const tk::var<float, Device>& logits,
                                       const tk::tensor<std::int64_t, Device>& y) {
  return ag::cross_entropy(ag::reshape(logits, {-1, logits.size(-1)}), y.reshape({-1}));
}

/// n characters sampled from the model after `prompt`, temperature 0.8, from gen's uniform stream.
template <class Device>
std::string generate(gpt<Device>& model, const tk::data::char_vocabulary& vocab, const std::string& prompt, index_t n,
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
    // The last position's logits [1, 1, V], on the host.
    const auto logits = model.forward(x.template to<Device>()).value().slice(1, t - 1, t).contiguous().template to<tk::cpu>();
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

/// The command line, its defaults and their checks (both builds).
example::flags gpt_flags(int argc, char** argv) {
  return example::flags(argc, argv,
                        {{"text", "/usr/share/games/fortunes/fortunes,/usr/share/games/fortunes/literature,"
                                  "/usr/share/games/fortunes/riddles"},
                         {"steps", "2000"}, {"batch", "32"}, {"context", "64"}, {"layers", "4"}, {"embd", "128"},
                         {"heads", "4"}, {"dropout", "0"}, {"lr", "0.001"}, {"weight-decay", "0.1"}, {"clip", "1"},
                         {"seed", "1"}, {"precision", "fp32"}, {"checkpoint", "none"}, {"snapshot-dir", ""},
                         {"resume", "0"}, {"snapshot-every", "500"}, {"stop-after", "0"}, {"eval-every", "250"},
                         {"sample-chars", "300"}});
}

/// The whole job on Device for one precision policy (a type; the recompute policy is chosen at
/// run time). `comm` (MPI) carries the control messages (the mean loss, snapshot agreement),
/// `grads` the gradients: the same mpi object on the CPU, NCCL on GPUs. Returns the exit status.
/// \tparam Memory the loaders' batch memory (pageable_memory on the CPU, gpu::pinned_memory on CUDA)
template <class Device, class Memory, class Precision, class Grads>
int train(tk::dist::mpi& comm, Grads& grads, const example::flags& f, const tk::checkpoint::recompute_choice& recompute) {
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
  using loader = tk::data::data_loader<tk::data::token_windows, tk::data::distributed_sampler, Memory>;
  loader batches(train_set, shard, {.batch_size = batch, .num_workers = 1, .drop_last = true});
  loader val_batches(val_set, tk::data::sequential_sampler(val_set.size()), {.batch_size = 64});

  // The model: the same initialisation on every rank (data_parallel checks it and broadcasts rank
  // 0's); then its generator, which the dropout layers draw from, goes on per rank.
  tk::generator gen(seed);
  gpt<Device> model(c, gen);
  tk::parallel::data_parallel<Grads, tk::compression::none, float, Device> ddp(grads, model);
  gen.set_state(seed * 1000 + std::uint64_t(rank), 0);
  say("model: %lld layers, %lld embedding, %lld heads, context %lld; %lld parameters; %d rank(s) x batch %lld\n",
      (long long)c.layers, (long long)c.embd, (long long)c.heads, (long long)c.context,
      (long long)model.num_parameters(), world, (long long)batch);
  if constexpr (std::is_same_v<Device, tk::cpu>) say("%s\n", example::threads_line().c_str());

  tk::optim::adamw<float, Device> opt(tk::optim::decay_groups(model.named_parameters(), weight_decay),
                                      {.lr = lr, .beta2 = 0.99, .weight_decay = weight_decay});
  tk::optim::warmup_cosine_lr schedule(
      {.base_lr = lr, .warmup_steps = std::min<index_t>(100, steps / 10), .total_steps = steps, .min_lr = lr / 10});
  schedule.apply(opt);
  // The loss stays on the device (read_loss false): a GPU step does not wait for the GPU; the sum
  // below is read once per --eval-every steps.
  using scaler_t = tk::amp::default_scaler_t<Precision>;
  tk::train::train_step<gpt<Device>, decltype(opt), Precision, scaler_t, tk::checkpoint::recompute_choice,
                        decltype(ddp)>
      step(model, opt, ddp, {.max_grad_norm = clip, .read_loss = false}, scaler_t(), recompute);
  step.attach_schedule(schedule);
  say("precision %s  checkpoint %s\n", std::string(Precision::name).c_str(),
      tk::checkpoint::to_string(recompute).c_str());

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
    return tk::train::evaluate(model, val_batches, [](const auto& logits, const auto& y) {
      return ag::cross_entropy(logits, y);
    }, tk::amp::module_forward<Precision>{});
  };
  example::stopwatch clock;
  std::vector<double> step_seconds;  // each step's wall time (the batch at hand), for the median
  auto loss_sum = tk::tensor<float, Device>::zeros({});  // this interval's losses, on the device
  index_t since = 0;
  while (run.step() < steps) {
    if (!batches.has_next()) batches.set_epoch(batches.epoch() + 1);
    const auto b = batches.next();
    example::stopwatch step_clock;
    const auto y = b.y.template to<Device>();  // from pinned memory on a GPU: asynchronous
    step(b.x.template to<Device>(), [&](const auto& logits) { return next_token_loss(logits, y); });
    tk::add_(loss_sum, step.last_loss(), 1.0);
    step_seconds.push_back(step_clock.seconds());  // on a GPU: once the launch queue is full, the GPU's time
    ++since;
    if (stop_after > 0 && run.step() + 1 - first_step == stop_after) run.request_stop();  // on every rank
    const bool stop = run.step_done();
    const auto k = index_t(run.step());
    if (k % eval_every == 0 || k == steps) {
      double mean = double(loss_sum.item()) / world;  // waits for the interval's steps
      comm.allreduce(&mean, 1, tk::dist::reduce_op::sum).wait();  // the mean over all ranks' batches
      const double seconds = clock.seconds();
      const auto v = validate();  // every rank holds the same model: the same figures
      say("step %lld  train loss %.4f  val loss %.4f nats/char  val accuracy %.1f%%  %.0f chars/s\n", (long long)k,
          mean / double(since), v.mean_loss(), 100 * v.accuracy(), double(since * batch * c.context * world) / seconds);
      tk::fill_(loss_sum, 0.0f);
      since = 0, clock = example::stopwatch();
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
        double(tk::allocator<Device>::stats().peak) / (1 << 20));
  }
  if (sample_chars > 0 && rank == 0) {
    tk::generator sample_gen(seed + 1);
    say("sample:\n%s\n", generate(model, vocab, "\n", sample_chars, sample_gen).c_str());
  }
  if (const std::string w = example::wait_line(); !w.empty()) say("%s\n", w.c_str());
  say("done  parameters digest %016llx\n", (unsigned long long)example::digest(model));
  return 0;
}

/// train() for the precision policy of --precision.
template <class Device, class Memory, class Grads>
int train_with(tk::dist::mpi& comm, Grads& grads, const example::flags& f) {
  const auto recompute = tk::checkpoint::parse_recompute(f.str("checkpoint"));
  switch (tk::amp::parse_precision(f.str("precision"))) {
    case tk::amp::precision_kind::fp32: return train<Device, Memory, tk::amp::fp32>(comm, grads, f, recompute);
    case tk::amp::precision_kind::fp16: return train<Device, Memory, tk::amp::mixed_fp16>(comm, grads, f, recompute);
    case tk::amp::precision_kind::bf16: return train<Device, Memory, tk::amp::mixed_bf16>(comm, grads, f, recompute);
  }
  return 1;
}

/// main() around `job` (returns the exit status). An error is printed first: a failed peer
/// (dist_error, naming it) exits 75, worth restarting; this rank's own error (a bad flag, an
/// unreadable --text) ends every rank now instead of leaving them in their next collective until
/// the timeout.
template <class Job>
int gpt_main(const char* program, int argc, char** argv, Job job) {
  tk::io::catch_stop_signals_early();  // a stop while MPI starts is still a snapshot and 75
  tk::dist::mpi::environment env(argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  try {
    return job();
  } catch (const tk::dist::dist_error& e) {
    std::fprintf(stderr, "%s: rank %d: %s\n", program, rank, e.what());
    return example::exit_restart;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: rank %d: %s\n", program, rank, e.what());
    std::fflush(stderr);
    tk::dist::abort_job(1);
  }
}

}  // namespace

#ifndef GPT_CHAR_JOB_ONLY  // the CPU build's main(); gpt_char.cu has its own

TRAINKIT_THREAD_DEFAULTS();

int main(int argc, char** argv) {
  return gpt_main("gpt_char", argc, argv, [&] {
    const auto f = gpt_flags(argc, argv);
    tk::dist::mpi comm;
    return train_with<tk::cpu, tk::data::pageable_memory>(comm, comm, f);
  });
}

#endif  // GPT_CHAR_JOB_ONLY
#endif  // GPT_CHAR_MODEL_ONLY
