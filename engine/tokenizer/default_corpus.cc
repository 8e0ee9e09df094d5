// The built-in training corpus for the default tokenizer: English prose and code written for
// this project (no third-party text), a few KB, so the default model needs no download.
#include "engine/tokenizer/bpe_trainer.h"

namespace moe::engine {
namespace {

constexpr char kCorpus[] = R"corpus(
The service answers requests for text. A client sends a prompt, the server turns the prompt
into tokens, and the model predicts one token after another until it reaches a stop token or
the length limit. Each new token is turned back into text and streamed to the client.

A mixture of experts is a model in which every layer holds many small feed-forward networks,
called experts, and a router that picks a few of them for each token. Only the chosen experts
run, so the model can be large while each step stays cheap. The hard part is memory: all of the
experts must live somewhere, and the ones a token needs must be close to the GPU when it needs
them. We keep hot experts in device memory, warm ones in host memory, and the rest on disk.

The scheduler decides which sequences run in the next step. New requests are prefilled in
chunks, running requests decode one token at a time, and when the key-value cache is full the
youngest sequence is paused and resumed later. The batch changes every step, and that is fine:
the forward pass does not care which request a row belongs to.

Numbers matter here. A step that takes 25 ms serves 40 tokens per second per sequence; with
64 sequences in the batch that is 2560 tokens per second. Loading an expert of 12 MiB over a
link of 25 GB/s takes about 0.5 ms, so a miss costs less than a step but more than a kernel.
We measure the hit rate, the bytes moved, and the time to first token, and we print them.

Good tests compare every element. When the CPU reference and the CUDA kernel disagree, the test
names the worst index and prints both values. A test that is never run is not a test at all.
Errors are values: a bad request gets a status that names the field, and the server keeps going.

Questions and answers:
Q: What is a token? A: A piece of text, often a word or part of a word, with an id.
Q: Why bytes? A: Every string is a sequence of bytes, so nothing is ever unknown.
Q: What's the cache for? A: It's where we keep the keys and values we've already computed.
I'm sure it'll work, but we'd better check. They're ready; you've seen it; she'd agree.

def softmax(xs):
    m = max(xs)
    exps = [math.exp(x - m) for x in xs]
    total = sum(exps)
    return [e / total for e in exps]

def top_k(scores, k):
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    return order[:k]

class Router:
    def __init__(self, num_experts, top_k=2):
        self.num_experts = num_experts
        self.top_k = top_k

    def route(self, logits):
        probs = softmax(logits)
        chosen = top_k(probs, self.top_k)
        weight = sum(probs[i] for i in chosen)
        return [(i, probs[i] / weight) for i in chosen]

// C++: a tiny ring buffer.
template <typename T, size_t N>
class RingBuffer {
 public:
  bool Push(const T& value) {
    if (size_ == N) return false;
    data_[(head_ + size_) % N] = value;
    ++size_;
    return true;
  }
  std::optional<T> Pop() {
    if (size_ == 0) return std::nullopt;
    T value = data_[head_];
    head_ = (head_ + 1) % N;
    --size_;
    return value;
  }

 private:
  std::array<T, N> data_{};
  size_t head_ = 0;
  size_t size_ = 0;
};

int main(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    std::printf("%d: %s\n", i, argv[i]);
  }
  return 0;
}

{"model": "default", "prompt": "Hello, world!", "max_tokens": 16, "temperature": 0.7}
{"id": 42, "text": "The quick brown fox jumps over the lazy dog.", "finish_reason": "stop"}

$ moe-generate --model default --prompt "Write a haiku about memory" --max_tokens 32
$ ctest --test-dir build -LE gpu --output-on-failure

To be or not to be is not the question here; the question is whether the expert is resident.
Small files, clear names, and comments that say why. Read the code, run the tests, ship it.
One, two, three, four, five, six, seven, eight, nine, ten. First, second, third, last.
Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday. January, February, March.
Le café est prêt. Das Modell ist groß. El niño juega. Ça va très bien, merci.
)corpus";

}  // namespace

absl::string_view DefaultCorpus() { return absl::string_view(kCorpus, sizeof(kCorpus) - 1); }

}  // namespace moe::engine
