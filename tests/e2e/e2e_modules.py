"""The nn.Module half of the end-to-end corpus: models shaped like the ones people train.

MLPs, conv+BatchNorm+ReLU (train mode updates running stats in place), residual blocks with a
downsample branch, attention and the small GPT of examples.gpt, embedding bags, loops over
ModuleLists with keyword arguments, buffers updated in place, a module flag that forces a
recompile, and a module called with varying batch sizes. Each builder returns a fresh Program.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from e2e_harness import Program, case
from examples.gpt import GPT, CausalSelfAttention, GPTConfig, sample_batch


def _gen(seed: int = 1) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed))


def _one_call(*args, **kwargs) -> list[tuple[tuple, dict]]:
    return [(args, kwargs)]


@case()
def mlp_sequential() -> Program:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))
    x = _randn(8, 16)
    return Program(model, [((x,), {}), ((x * 2,), {})])


@case()
def mlp_training_grads() -> Program:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 24), nn.GELU(), nn.LayerNorm(24), nn.Linear(24, 3))
    x = _randn(6, 12).requires_grad_()
    return Program(model, _one_call(x), backward=True, grads_of=[x, *model.parameters()])


class ConvBNReLU(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


@case()
def conv_bn_relu_train() -> Program:
    torch.manual_seed(0)
    block = ConvBNReLU(3, 8).train()
    x = _randn(2, 3, 8, 8)
    state = lambda: (block.bn.running_mean, block.bn.running_var, block.bn.num_batches_tracked)
    return Program(block, [((x,), {}), ((x + 1,), {})], state=state)


@case()
def conv_bn_relu_eval() -> Program:
    torch.manual_seed(0)
    block = ConvBNReLU(3, 8)
    block.bn.running_mean.uniform_(-0.5, 0.5)
    block.eval()
    return Program(block, _one_call(_randn(2, 3, 8, 8)))


class BasicBlock(nn.Module):
    """A ResNet basic block; the shortcut is a strided 1x1 conv when the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return F.relu(out + identity)


@case()
def resnet_blocks() -> Program:
    torch.manual_seed(0)
    net = nn.Sequential(BasicBlock(4, 8, 2), BasicBlock(8, 8, 1)).eval()
    return Program(net, _one_call(_randn(2, 4, 8, 8)))


@case()
def causal_attention() -> Program:
    torch.manual_seed(0)
    attn = CausalSelfAttention(GPTConfig(block_size=16, n_head=2, n_embd=16)).eval()
    return Program(attn, _one_call(_randn(2, 8, 16)))


@case(tol=1e-4)
def gpt_forward_with_loss() -> Program:
    torch.manual_seed(0)
    config = GPTConfig(block_size=16, vocab_size=32, n_layer=2, n_head=2, n_embd=16)
    model = GPT(config).eval()
    idx, targets = sample_batch(config, 2, 8)
    return Program(model, [((idx,), {"targets": targets}), ((idx,), {})])


@case(tol=1e-4)
def gpt_training_grads() -> Program:
    torch.manual_seed(0)
    config = GPTConfig(block_size=16, vocab_size=32, n_layer=1, n_head=2, n_embd=16)
    model = GPT(config).train()
    idx, targets = sample_batch(config, 2, 8)

    class LossOnly(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            return self.model(idx, targets)[1]

    return Program(LossOnly(), _one_call(idx, targets), backward=True, grads_of=list(model.parameters()))


@case()
def embedding_bag_mean() -> Program:
    torch.manual_seed(0)

    class BagClassifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bag = nn.EmbeddingBag(50, 8, mode="mean")
            self.head = nn.Linear(8, 3)

        def forward(self, tokens: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
            return self.head(self.bag(tokens, offsets))

    tokens = torch.randint(0, 50, (12,), generator=_gen())
    return Program(BagClassifier(), _one_call(tokens, torch.tensor([0, 3, 7])))


@case()
def embedding_sum_pool() -> Program:
    torch.manual_seed(0)
    emb = nn.Embedding(40, 6, padding_idx=0)

    def pool(tokens: torch.Tensor) -> torch.Tensor:
        mask = (tokens != 0).unsqueeze(-1).to(torch.float32)
        return (emb(tokens) * mask).sum(1) / mask.sum(1).clamp(min=1.0)

    tokens = torch.randint(0, 40, (3, 5), generator=_gen())
    tokens[0, 3:] = 0
    return Program(pool, _one_call(tokens))


class Stack(nn.Module):
    """A loop over a ModuleList with a keyword argument and a per-layer scale list."""

    def __init__(self, depth: int, dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(dim, dim) for _ in range(depth))
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(depth))
        self.scales = [1.0 / (i + 1) for i in range(depth)]

    def forward(self, x: torch.Tensor, *, residual: bool = True, temperature: float = 1.0) -> torch.Tensor:
        for i, (layer, norm) in enumerate(zip(self.layers, self.norms)):
            y = layer(norm(x)) * self.scales[i]
            x = x + y if residual else y
        return x / temperature


@case()
def modulelist_loop_kwargs() -> Program:
    torch.manual_seed(0)
    x = _randn(4, 8)
    calls = [((x,), {}), ((x,), {"residual": True}), ((x,), {"residual": False}), ((x,), {"temperature": 2.0})]
    return Program(Stack(3, 8), calls)


class RunningStats(nn.Module):
    """Updates buffers in place on every call, as normalisers and EMA trackers do."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))
        self.momentum = 0.1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.mean.mul_(1 - self.momentum).add_(x.mean(0), alpha=self.momentum)
        self.count += 1
        return x - self.mean


@case()
def buffer_inplace_updates() -> Program:
    module = RunningStats(5)
    x = _randn(4, 5)
    return Program(module, [((x,), {}), ((x * 3,), {}), ((x - 1,), {})], state=lambda: (module.mean, module.count))


class TrainOnlyScale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        if self.training:
            y = y * 0.5
        return y


@case()
def training_flag_recompiles() -> Program:
    torch.manual_seed(0)
    module = TrainOnlyScale()
    x = _randn(2, 4)
    calls = [((x,), {}), ((x,), {})]

    def flip_after_first() -> bool:
        # the state hook runs after each call: switching to eval here makes the second call see it
        was = module.training
        module.eval()
        return was

    return Program(module, calls, state=flip_after_first)


@case()
def varying_batch_sizes() -> Program:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 12), nn.GELU(), nn.Linear(12, 6))
    calls = [((_randn(b, 6, seed=b),), {}) for b in (4, 5, 6, 7, 9, 4)]
    return Program(model, calls)


@case()
def conv1d_classifier_head() -> Program:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv1d(4, 8, 3, padding=1), nn.ReLU(), nn.MaxPool1d(2), nn.Conv1d(8, 8, 3), nn.AdaptiveAvgPool1d(1),
        nn.Flatten(), nn.Dropout(0.5), nn.Linear(8, 2),
    ).eval()
    return Program(model, _one_call(_randn(3, 4, 16)))


class GRUCellLoop(nn.Module):
    """A hand-written recurrent loop over time steps, unrolled by capture."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.cell = nn.GRUCell(dim, hidden)
        self.hidden = hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.new_zeros(x.shape[0], self.hidden)
        outs = []
        for t in range(x.shape[1]):
            h = self.cell(x[:, t], h)
            outs.append(h)
        return torch.stack(outs, dim=1)


@case()
def gru_cell_loop() -> Program:
    torch.manual_seed(0)
    return Program(GRUCellLoop(3, 5), _one_call(_randn(2, 4, 3)))


class TwoHeads(nn.Module):
    """Returns a dict of named outputs, the shape of detection and multi-task heads."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Linear(6, 8)
        self.heads = nn.ModuleDict({"cls": nn.Linear(8, 3), "box": nn.Linear(8, 4)})

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        h = torch.relu(self.trunk(x))
        out = {name: head(h) for name, head in self.heads.items()}
        out["probs"] = out["cls"].softmax(-1)
        return out


@case()
def moduledict_returns_dict() -> Program:
    torch.manual_seed(0)
    return Program(TwoHeads(), _one_call(_randn(3, 6)))


class SDPABlock(nn.Module):
    """Attention through F.scaled_dot_product_attention (the fused op most models now call)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).reshape(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, c))


@case()
def sdpa_causal_block() -> Program:
    torch.manual_seed(0)
    return Program(SDPABlock(16, 4).eval(), _one_call(_randn(2, 6, 16)))


class TopKRouter(nn.Module):
    """Mixture-of-experts routing: top-k gates, a gather of expert outputs, weights renormalised."""

    def __init__(self, dim: int, experts: int, k: int) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, experts)
        self.experts = nn.ModuleList(nn.Linear(dim, dim) for _ in range(experts))
        self.k = k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, chosen = self.gate(x).softmax(-1).topk(self.k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        all_out = torch.stack([expert(x) for expert in self.experts], dim=1)  # (n, experts, dim)
        picked = all_out.gather(1, chosen.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
        return (picked * weights.unsqueeze(-1)).sum(1)


@case()
def topk_expert_routing() -> Program:
    torch.manual_seed(0)
    return Program(TopKRouter(8, 4, 2), _one_call(_randn(5, 8)))


class LengthMaskedClassifier(nn.Module):
    """Padding masks built from sequence lengths, a masked mean pool and a label-smoothed loss."""

    def __init__(self, vocab: int, dim: int, classes: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        mask = torch.arange(tokens.shape[1], device=tokens.device)[None, :] < lengths[:, None]
        h = self.embed(tokens) * mask.unsqueeze(-1)
        pooled = h.sum(1) / lengths[:, None].to(h.dtype)
        return F.cross_entropy(self.head(pooled), labels, label_smoothing=0.1)


@case()
def length_masks_and_smoothed_loss() -> Program:
    torch.manual_seed(0)
    model = LengthMaskedClassifier(30, 8, 3)
    gen = _gen()
    tokens = torch.randint(0, 30, (4, 7), generator=gen)
    lengths, labels = torch.tensor([7, 3, 5, 1]), torch.tensor([0, 2, 1, 1])
    return Program(model, _one_call(tokens, lengths, labels), backward=True, grads_of=list(model.parameters()))
