// trainkit/precompiled.hpp - the float/CPU specialisations every training program instantiates,
// named once so that they are compiled once.
//
// With TRAINKIT_PRECOMPILED (what linking the CMake target trainkit::precompiled defines), these
// are explicit instantiation declarations: a file that includes <trainkit/trainkit.hpp> no longer
// instantiates, optimises and emits the autograd ops, the backward pass, the tensor kernels behind
// them and the data readers for float on the CPU - trainkit::precompiled holds them, compiled once
// by the consumer's own compiler with the consumer's own flags from one generated source file that
// defines TRAINKIT_PRECOMPILED_DEFINITIONS (which turns the same list into explicit instantiation
// definitions). Without either macro this header is not included and nothing changes: trainkit
// stays header-only, and a file that instantiates any of these itself is still correct (the
// instantiations are weak, the same code either way).
//
// Only function templates are listed. A class template's members defined in its body are inline,
// and an optimising compiler instantiates those anyway to consider inlining them; the heavy work
// sits in the free functions (each op's forward and its backward node, the element loops, GEMM and
// reduction kernels) that these names reach.
// What they save: benchmarks/compile_time.sh (figures in benchmarks/README.md, "Compile time").
#pragma once

#include "trainkit/ops/ops.hpp"
#include "trainkit/autograd/autograd.hpp"
#include "trainkit/data/data.hpp"
#include "trainkit/nn/nn.hpp"
#include "trainkit/optim/optim.hpp"

#if defined(TRAINKIT_PRECOMPILED_DEFINITIONS)
#define TRAINKIT_INSTANTIATE template
#else
#define TRAINKIT_INSTANTIATE extern template
#endif

/// \cond TRAINKIT_INSTANTIATIONS  (a list for the compiler; Doxygen reads these as declarations)
namespace trainkit {

namespace precompiled_detail {
using v = autograd::var<float, cpu>;
using t = tensor<float, cpu>;
using labels = tensor<std::int64_t, cpu>;
using dims = std::vector<index_t>;
}  // namespace precompiled_detail

// ---- tensor operations (ops/)
TRAINKIT_INSTANTIATE precompiled_detail::t sum(const precompiled_detail::t&, const precompiled_detail::dims&, bool);
TRAINKIT_INSTANTIATE precompiled_detail::t mean(const precompiled_detail::t&, const precompiled_detail::dims&, bool);
TRAINKIT_INSTANTIATE precompiled_detail::t amax(const precompiled_detail::t&, const precompiled_detail::dims&, bool);
TRAINKIT_INSTANTIATE precompiled_detail::labels argmax(const precompiled_detail::t&, index_t, bool);
TRAINKIT_INSTANTIATE precompiled_detail::t sum_to(const precompiled_detail::t&, const shape&);
TRAINKIT_INSTANTIATE precompiled_detail::t mm(const precompiled_detail::t&, const precompiled_detail::t&);
TRAINKIT_INSTANTIATE precompiled_detail::t matmul(const precompiled_detail::t&, const precompiled_detail::t&);
TRAINKIT_INSTANTIATE void mm_into(precompiled_detail::t&, const precompiled_detail::t&, const precompiled_detail::t&,
                                  double, double);
TRAINKIT_INSTANTIATE precompiled_detail::t concat(const std::vector<precompiled_detail::t>&, index_t);
TRAINKIT_INSTANTIATE void copy_(precompiled_detail::t&, const precompiled_detail::t&);
TRAINKIT_INSTANTIATE void fill_(precompiled_detail::t&, float);
TRAINKIT_INSTANTIATE void add_(precompiled_detail::t&, const precompiled_detail::t&, double);
TRAINKIT_INSTANTIATE void mul_(precompiled_detail::t&, double);
TRAINKIT_INSTANTIATE void zero_(precompiled_detail::t&);

namespace autograd {
// ---- the backward pass
TRAINKIT_INSTANTIATE void backward(const precompiled_detail::v&, precompiled_detail::t, bool);

// ---- ops with backward (autograd/ops/)
TRAINKIT_INSTANTIATE precompiled_detail::v add(const precompiled_detail::v&, const precompiled_detail::v&, double);
TRAINKIT_INSTANTIATE precompiled_detail::v sub(const precompiled_detail::v&, const precompiled_detail::v&);
TRAINKIT_INSTANTIATE precompiled_detail::v mul(const precompiled_detail::v&, const precompiled_detail::v&);
TRAINKIT_INSTANTIATE precompiled_detail::v div(const precompiled_detail::v&, const precompiled_detail::v&);
TRAINKIT_INSTANTIATE precompiled_detail::v neg(const precompiled_detail::v&);
TRAINKIT_INSTANTIATE precompiled_detail::v add(const precompiled_detail::v&, double);
TRAINKIT_INSTANTIATE precompiled_detail::v mul(const precompiled_detail::v&, double);
TRAINKIT_INSTANTIATE precompiled_detail::v pow(const precompiled_detail::v&, double);
TRAINKIT_INSTANTIATE precompiled_detail::v exp(const precompiled_detail::v&);
TRAINKIT_INSTANTIATE precompiled_detail::v log(const precompiled_detail::v&);
TRAINKIT_INSTANTIATE precompiled_detail::v sqrt(const precompiled_detail::v&);
TRAINKIT_INSTANTIATE precompiled_detail::v tanh(const precompiled_detail::v&);
TRAINKIT_INSTANTIATE precompiled_detail::v sigmoid(const precompiled_detail::v&);
TRAINKIT_INSTANTIATE precompiled_detail::v relu(const precompiled_detail::v&);
TRAINKIT_INSTANTIATE precompiled_detail::v gelu(const precompiled_detail::v&);
TRAINKIT_INSTANTIATE precompiled_detail::v matmul(const precompiled_detail::v&, const precompiled_detail::v&);
TRAINKIT_INSTANTIATE precompiled_detail::v linear(const precompiled_detail::v&, const precompiled_detail::v&,
                                                  const precompiled_detail::v&);
TRAINKIT_INSTANTIATE precompiled_detail::v conv2d(const precompiled_detail::v&, const precompiled_detail::v&,
                                                  const precompiled_detail::v&, conv2d_options);
TRAINKIT_INSTANTIATE precompiled_detail::v max_pool2d(const precompiled_detail::v&, pool2d_options);
TRAINKIT_INSTANTIATE precompiled_detail::v avg_pool2d(const precompiled_detail::v&, pool2d_options);
TRAINKIT_INSTANTIATE precompiled_detail::v batch_norm(const precompiled_detail::v&, const precompiled_detail::v&,
                                                      const precompiled_detail::v&, precompiled_detail::t&,
                                                      precompiled_detail::t&, bool, double, double);
TRAINKIT_INSTANTIATE precompiled_detail::v layer_norm(const precompiled_detail::v&, const shape&,
                                                      const precompiled_detail::v&, const precompiled_detail::v&, double);
TRAINKIT_INSTANTIATE precompiled_detail::v dropout(const precompiled_detail::v&, double, bool, generator&);
TRAINKIT_INSTANTIATE precompiled_detail::v embedding(const precompiled_detail::labels&, const precompiled_detail::v&);
TRAINKIT_INSTANTIATE precompiled_detail::v softmax(const precompiled_detail::v&, index_t);
TRAINKIT_INSTANTIATE precompiled_detail::v log_softmax(const precompiled_detail::v&, index_t);
TRAINKIT_INSTANTIATE precompiled_detail::v cross_entropy(const precompiled_detail::v&, const precompiled_detail::labels&,
                                                         cross_entropy_options);
TRAINKIT_INSTANTIATE precompiled_detail::v nll_loss(const precompiled_detail::v&, const precompiled_detail::labels&,
                                                    nll_loss_options);
TRAINKIT_INSTANTIATE precompiled_detail::v mse_loss(const precompiled_detail::v&, const precompiled_detail::v&, reduction);
TRAINKIT_INSTANTIATE precompiled_detail::v sum(const precompiled_detail::v&, const precompiled_detail::dims&, bool);
TRAINKIT_INSTANTIATE precompiled_detail::v mean(const precompiled_detail::v&, const precompiled_detail::dims&, bool);
TRAINKIT_INSTANTIATE precompiled_detail::v reshape(const precompiled_detail::v&, shape);
TRAINKIT_INSTANTIATE precompiled_detail::v flatten(const precompiled_detail::v&, index_t, index_t);
TRAINKIT_INSTANTIATE precompiled_detail::v transpose(const precompiled_detail::v&, index_t, index_t);
TRAINKIT_INSTANTIATE precompiled_detail::v concat(const std::vector<precompiled_detail::v>&, index_t);
}  // namespace autograd

namespace optim::detail {
// ---- the optimizers' fused update loops (their step() is inline in the class)
TRAINKIT_INSTANTIATE void fused_update(const sgd_update<float>&, precompiled_detail::t&, const precompiled_detail::t&);
TRAINKIT_INSTANTIATE void fused_update(const sgd_momentum_update<float>&, precompiled_detail::t&,
                                       const precompiled_detail::t&, precompiled_detail::t&);
TRAINKIT_INSTANTIATE void fused_update(const adam_update<float>&, precompiled_detail::t&, const precompiled_detail::t&,
                                       precompiled_detail::t&, precompiled_detail::t&);
TRAINKIT_INSTANTIATE void fused_update(const adam_update<float>&, precompiled_detail::t&, const precompiled_detail::t&,
                                       precompiled_detail::t&, precompiled_detail::t&, precompiled_detail::t&);
}  // namespace optim::detail

namespace data {
// ---- data sets
TRAINKIT_INSTANTIATE basic_dataset<float> load_mnist(const std::filesystem::path&, split, const mnist_options&);
TRAINKIT_INSTANTIATE basic_dataset<float> load_cifar10(const std::filesystem::path&, split, const cifar10_options&);
}  // namespace data

// ---- classes: their members defined in the class body are still instantiated where used (to be
// inlined), but no longer emitted out of line in every file
TRAINKIT_INSTANTIATE class nn::module<float, cpu>;
TRAINKIT_INSTANTIATE class nn::linear<float, cpu>;
TRAINKIT_INSTANTIATE class nn::conv2d<float, cpu>;
TRAINKIT_INSTANTIATE class nn::sequential<float, cpu>;
TRAINKIT_INSTANTIATE class nn::relu<float, cpu>;
TRAINKIT_INSTANTIATE class nn::flatten<float, cpu>;
TRAINKIT_INSTANTIATE class nn::dropout<float, cpu>;
TRAINKIT_INSTANTIATE class nn::max_pool2d<float, cpu>;
TRAINKIT_INSTANTIATE class nn::batch_norm2d<float, cpu>;
TRAINKIT_INSTANTIATE class optim::optimizer_base<float, cpu>;
TRAINKIT_INSTANTIATE class optim::sgd<float, cpu>;
TRAINKIT_INSTANTIATE class optim::detail::adam_family<float, cpu, optim::adam_options, false>;
TRAINKIT_INSTANTIATE class optim::detail::adam_family<float, cpu, optim::adamw_options, true>;
TRAINKIT_INSTANTIATE class optim::adam<float, cpu>;
TRAINKIT_INSTANTIATE class optim::adamw<float, cpu>;
TRAINKIT_INSTANTIATE class data::batch_iterator<float>;

}  // namespace trainkit
/// \endcond

#undef TRAINKIT_INSTANTIATE
