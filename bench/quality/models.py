"""The two models the quality tasks train: torch modules whose sequence mixer is attnbench's attention.

Everything but the attention is torch's (nn.Embedding, nn.Linear, nn.LayerNorm, nn.Conv1d, F.logsigmoid ...),
as in Zoology. The attention is a callable `attention(variant, q, k, v, **options)`: attnbench's
`attention_function` (attnbench.autograd: the variant's fp32 kernels for float32 tensors, its fp64 definition
for float64), or, in the gradient test (tests/interop/test_quality_grad.py), a plain-torch definition.

- CapacityModel: Schlag, Irie & Schmidhuber 2021, section 6.1 (ischlag/fast-weight-transformers `synthetic/`):
  one attention read-out of a query key over N (key, value) pairs, learned key embeddings, frozen one-hot
  values, no MLP.
- LanguageModel: Zoology's model for MQAR (Arora et al. 2023): token embedding (+ learned positions for the
  softmax variants), pre-LN blocks whose only sublayer is the variant as sequence mixer, final LayerNorm, a
  head tied to the embedding, init N(0, 0.02).

What the model adds around a variant depends on its family (`VariantSpec.family`), read from its
capabilities: a recurrence (capability own_definition) gets g and beta from learned projections of its input
when it reads them (capabilities gate, beta); "kernel" variants (feature-map attention: linear, performer) and
recurrences get no learned positions in the LanguageModel (Zoology gives them to attention only) and Schlag's
linear-model init in the CapacityModel; every other variant is of the softmax family.
"""
import json
import math
import os

import torch
import torch.nn.functional as F
from torch import nn

# Feature-map attention (Katharopoulos et al., FAVOR+): Schlag's PrefixSumLinearAttentionModel, not his softmax
# model; no softmax over keys, so no learned positions in Zoology's recipe. A list of names because no
# capability tells a feature-map variant from a softmax one, kept as data in configs/quality_families.json
# (no variant is named outside variants/ and configs/); a variant not listed counts as softmax.
_FAMILIES_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs",
                              "quality_families.json")
with open(_FAMILIES_PATH, encoding="utf-8") as _f:
    KERNEL_VARIANTS = tuple(json.load(_f)["feature_map"])
# fla's GLA divides logsigmoid(gate logits) by 16 so that a fresh layer (logits near 0) decays by
# exp(-log(2)/16) = 0.958 per token rather than 0.5; every gated variant here gets the same.
GATE_LOGIT_NORMALIZER = 16.0
# The short causal depthwise convolution of fla's layers and Zoology's Based recipe (a config switch).
SHORT_CONV_KERNEL = 4
INIT_STD = 0.02  # Zoology's initializer_range

# Where these models depart from the papers' whatever the config says (meta.json `model_notes`, REPORT.md).
MODEL_NOTES = [
    "MQAR: no attention dropout (Zoology applies 0.1 to attention's weights only); every variant is trained "
    "alike, and most variants have no dropout.",
    "MQAR: each block is the plain pre-LN residual h += mixer(LN(h)); Zoology's block also adds its Identity state "
    "mixer's LayerNorm output back into the residual stream.",
    "MQAR: recurrences get g = logsigmoid(W_g x) / 16 (fla's GLA normaliser) and beta = sigmoid(W_b x), the "
    "delta rules L2-normalised q and k (fla's layers); retention's decay is its definition's, fixed per head.",
    "performer: its random features are drawn once from its `seed` parameter and kept for the whole run, m "
    "positive features exp(Wx' - |x'|^2/2)/sqrt(m) with x' = x d^-1/4 (attnbench's FAVOR+); Schlag's FAVOR+ "
    "redraws them every step and uses m positive and m negative features on x unscaled.",
    "capacity: the recurrences read Schlag's sum-normalised elu + 1 features with scale 1 (his delta rule); the "
    "other gated recurrences have no published capacity curve.",
    "capacity: nystrom reads the query by cross-attention, one query row, whose only landmark is the query itself; "
    "its approximation softmax(q L^T) pinv(softmax(q L^T)) softmax(q K^T) is then exact softmax attention "
    "(measured: the same losses as tiled), so its capacity row says nothing about Nystrom at seq_q > landmarks.",
]


class VariantSpec:
    """What the models need to know of a registered variant: its name, the parameters the config gives it and
    its capabilities (attnbench.variants()), and the family derived from them."""

    def __init__(self, name, params, capabilities):
        self.name = name
        self.params = dict(params)
        self.caps = dict(capabilities)
        gate = self.caps.get("gate")
        self.gate = gate if isinstance(gate, str) else "none"  # "none", "scalar" or "vector"
        self.beta = bool(self.caps.get("beta"))
        if self.caps.get("own_definition"):
            self.family = "recurrence"
        elif name in KERNEL_VARIANTS:
            self.family = "kernel"
        else:
            self.family = "softmax"

    @property
    def delta(self):
        """A delta rule (reads beta): its keys must be normalised for the update to stay a contraction."""
        return self.beta


def capacity_reads_cross(caps):
    """Whether the CapacityModel reads the query by cross-attention (one query row against the keys) rather
    than as the last token of a causal sequence: variants with cross-attention that are not recurrences."""
    return bool(caps.get("cross")) and not caps.get("own_definition")


def attnbench_attention(variant, q, k, v, **options):
    """The default attention op: attnbench.autograd.attention_function (imported on first use)."""
    import attnbench

    return attnbench.attention_function(variant, q, k, v, **options)


def _gate_and_beta(spec, gate_proj, beta_proj, x, heads):
    """g = logsigmoid(W_g x) / 16 (<= 0) as [B, H, L] (scalar gate) or [B, H, L, d_k] (per-channel gate), and
    beta = sigmoid(W_b x) in (0, 1) as [B, H, L], from x [B, L, width]; None for what the variant does not read."""
    g = beta = None
    if gate_proj is not None:
        logits = gate_proj(x)
        b, length = x.shape[:2]
        g = F.logsigmoid(logits) / GATE_LOGIT_NORMALIZER
        g = g.transpose(1, 2) if spec.gate == "scalar" else g.view(b, length, heads, -1).transpose(1, 2)
    if beta_proj is not None:
        beta = torch.sigmoid(beta_proj(x)).transpose(1, 2)
    return g, beta


def _gate_width(spec, heads, head_dim):
    return {"scalar": heads, "vector": heads * head_dim}.get(spec.gate, 0)


class SequenceMixer(nn.Module):
    """One attention sublayer: W_qkv, the optional short causal convolution (+ SiLU, as fla's ShortConvolution)
    on q, k and v, the variant (causal) and W_o. A recurrence gets g and beta from learned projections of the
    sublayer's input; a delta rule's q and k are L2-normalised here (fla's use_qk_l2norm), so the kernel runs
    with normalize_keys=0 (quality/config.py sets it) and the feature map stays the model's."""

    def __init__(self, d_model, heads, spec, short_conv, attention, options):
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model {d_model} is not a multiple of heads {heads}")
        self.heads, self.head_dim, self.spec = heads, d_model // heads, spec
        self.attention, self.options = attention, dict(options)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.conv = None
        if short_conv:
            self.conv = nn.Conv1d(3 * d_model, 3 * d_model, SHORT_CONV_KERNEL, groups=3 * d_model,
                                  padding=SHORT_CONV_KERNEL - 1)
        width = _gate_width(spec, heads, self.head_dim) if spec.family == "recurrence" else 0
        self.gate = nn.Linear(d_model, width) if width else None
        self.beta = nn.Linear(d_model, heads) if spec.beta else None
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        b, length, width = x.shape
        qkv = self.qkv(x)
        if self.conv is not None:  # causal: keep the first L outputs of the left-and-right padded convolution
            # (a contiguous [B, C, L] input: torch 1.13's CPU depthwise convolution is several times slower on
            # the transposed view)
            qkv = F.silu(self.conv(qkv.transpose(1, 2).contiguous())[..., :length]).transpose(1, 2)
        q, k, v = (t.reshape(b, length, self.heads, self.head_dim).transpose(1, 2).contiguous()
                   for t in qkv.split(width, dim=-1))
        if self.spec.delta:
            q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        g, beta = _gate_and_beta(self.spec, self.gate, self.beta, x, self.heads)
        extra = {name: t.contiguous() for name, t in (("g", g), ("beta", beta)) if t is not None}
        o = self.attention(self.spec.name, q, k, v, causal=True, params=self.spec.params, **extra, **self.options)
        return self.out_proj(o.transpose(1, 2).reshape(b, length, width))


def _init_zoology(module, layers):
    """Zoology's _init_weights: Linear and Embedding weights N(0, 0.02), biases 0, out_proj weights
    N(0, 0.02 / sqrt(2 * layers)) (its rescaled pre-norm residual init). Convolutions keep torch's init."""
    for name, m in module.named_modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            std = INIT_STD / math.sqrt(2 * layers) if name.endswith("out_proj") else INIT_STD
            nn.init.normal_(m.weight, std=std)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)


class LanguageModel(nn.Module):
    """Zoology's LanguageModel with the variant as every block's sequence mixer and no state mixer (its MQAR
    configs use torch.nn.Identity there): h = emb(x) [+ pos] -> dropout -> per block h += mixer(LN(h)) -> LN ->
    logits = h E^T (tied). Zoology's block adds the Identity state mixer's LayerNorm output back into the
    residual stream; here the block is the plain pre-LN residual."""

    def __init__(self, spec, vocab, d_model, layers, heads, seq_len, positions, short_conv, embed_dropout,
                 attention=attnbench_attention, options=None):
        super().__init__()
        self.embedding = nn.Embedding(vocab, d_model)
        self.positions = nn.Embedding(seq_len, d_model) if positions else None
        self.dropout = nn.Dropout(embed_dropout)
        self.norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(layers))
        self.mixers = nn.ModuleList(SequenceMixer(d_model, heads, spec, short_conv, attention, options or {})
                                    for _ in range(layers))
        self.final_norm = nn.LayerNorm(d_model)
        _init_zoology(self, layers)

    def forward(self, tokens, select=None):
        """Logits [B, L, vocab]; with `select` (a bool mask [B, L]) only at the selected positions, [M, vocab]:
        the final LayerNorm and the head act per position, so those rows are the same, and MQAR's loss, which
        ignores every other position, costs a head over M = B * kv_pairs rows instead of B * L."""
        h = self.embedding(tokens)
        if self.positions is not None:
            h = h + self.positions(torch.arange(tokens.shape[1]))
        h = self.dropout(h)
        for norm, mixer in zip(self.norms, self.mixers):
            h = h + mixer(norm(h))
        if select is not None:
            h = h[select]
        return F.linear(self.final_norm(h), self.embedding.weight)  # the head tied to the embedding


def _sum_normalised_elu(x):
    """Schlag's feature map for his delta rule ("ours"): phi = elu + 1, divided by its sum over the channels."""
    phi = F.elu(x) + 1.0
    return phi / phi.sum(dim=-1, keepdim=True)


class CapacityModel(nn.Module):
    """Schlag et al.'s associative-retrieval model around one attention read-out.

    Inputs: keys, values [B, S] (key ids 0..N-1, value ids N..2N-1, as in his vocabulary) and the query key
    [B]. x_i = [onehot(v_i) ; E(k_i)] with E a learned embedding of int(2N * 1.1) dims (N(0, 1) init, one row
    per vocabulary entry), K = W_k x, Q = W_q E(query), d = head_dim; V = onehot(v) is frozen; the output is
    the read-out y [B, N], compared with onehot(v_query) by 0.5 ||.||^2. Init as his models: xavier_uniform for
    W_k, W_q of the softmax family, U(+-1/sqrt(d)) for the kernel variants and recurrences (his linear
    model), torch's default biases.

    How the query reads: a variant with cross-attention (capability cross) attends from one query row to the
    S keys. The others (causal only, or self-attention only: the recurrences, sliding_window, bigbird) read
    the query as the last token of a causal sequence of S + 1 whose own key adds nothing: a padded key for the
    softmax variants (key_padding), a zero key with g = 0 for the recurrences (no update, no decay), as
    Schlag's delta-rule models read their state. A recurrence's q and k are his sum-normalised elu + 1
    features, read with scale 1 (his rule has none); its g and beta come from learned projections of x (his
    W_b for beta; the gate is ours). The values are N wide and head_dim need not be: V goes through the op in
    blocks of head_dim columns (the last zero-padded), one call per block; every variant is linear in V
    column by column, so that is one call with the whole V."""

    def __init__(self, spec, n, head_dim, attention=attnbench_attention, options=None):
        super().__init__()
        self.spec, self.n, self.head_dim = spec, n, head_dim
        self.attention, self.options = attention, dict(options or {})
        embedding_size = int(2 * n * 1.1)
        self.key_embedding = nn.Embedding(2 * n, embedding_size)
        self.w_k = nn.Linear(embedding_size + n, head_dim)
        self.w_q = nn.Linear(embedding_size, head_dim)
        recurrence = spec.family == "recurrence"
        width = _gate_width(spec, 1, head_dim) if recurrence else 0
        self.w_g = nn.Linear(embedding_size + n, width) if width else None
        self.w_b = nn.Linear(embedding_size + n, 1) if spec.beta else None
        nn.init.normal_(self.key_embedding.weight, mean=0.0, std=1.0)
        if spec.family == "softmax":
            nn.init.xavier_uniform_(self.w_k.weight)
            nn.init.xavier_uniform_(self.w_q.weight)
        else:
            bound = 1.0 / math.sqrt(head_dim)
            nn.init.uniform_(self.w_k.weight, -bound, bound)
            nn.init.uniform_(self.w_q.weight, -bound, bound)
        self.cross = capacity_reads_cross(spec.caps)
        if recurrence:
            self.options.setdefault("scale", 1.0)

    def value_blocks(self, onehot):
        """onehot [B, S, N] as head_dim-wide column blocks [B, 1, S, head_dim] (the last zero-padded)."""
        d = self.head_dim
        blocks = -(-self.n // d)
        padded = F.pad(onehot, (0, blocks * d - self.n))
        return [padded[..., i * d:(i + 1) * d].unsqueeze(1).contiguous() for i in range(blocks)]

    def forward(self, keys, values, query):
        onehot = F.one_hot(values - self.n, self.n).to(self.w_k.weight.dtype)
        x = torch.cat([onehot, self.key_embedding(keys)], dim=-1)  # Schlag's order: [value ; key embedding]
        k = self.w_k(x)
        q = self.w_q(self.key_embedding(query))
        if self.spec.family == "recurrence":
            k, q = _sum_normalised_elu(k), _sum_normalised_elu(q)
        if self.cross:
            return self._read_cross(q, k, onehot)
        return self._read_last_token(q, k, onehot, x)

    def _read_cross(self, q, k, onehot):
        q4, k4 = q[:, None, None, :].contiguous(), k.unsqueeze(1).contiguous()
        outs = [self.attention(self.spec.name, q4, k4, v, params=self.spec.params, **self.options)
                for v in self.value_blocks(onehot)]
        return torch.cat(outs, dim=-1)[:, 0, 0, :self.n]

    def _read_last_token(self, q, k, onehot, x):
        b, s = onehot.shape[:2]
        zero_row = k.new_zeros(b, 1, k.shape[-1])
        k_seq = torch.cat([k, zero_row], dim=1).unsqueeze(1).contiguous()
        q_seq = torch.cat([k.new_zeros(b, s, q.shape[-1]), q.unsqueeze(1)], dim=1).unsqueeze(1).contiguous()
        v_blocks = [torch.cat([v, v.new_zeros(b, 1, 1, v.shape[-1])], dim=2) for v in self.value_blocks(onehot)]
        options = dict(self.options, causal=True)
        if self.spec.family == "recurrence":
            g, beta = _gate_and_beta(self.spec, self.w_g, self.w_b, x, 1)
            if g is not None:  # the query token neither decays nor writes the state
                options["g"] = torch.cat([g, g.new_zeros(g.shape[:2] + (1,) + g.shape[3:])], dim=2).contiguous()
            if beta is not None:
                options["beta"] = torch.cat([beta, beta.new_ones(b, 1, 1)], dim=2).contiguous()
        else:
            padding = torch.zeros(b, s + 1, dtype=torch.bool)
            padding[:, -1] = True  # the query token's own key adds nothing
            options["key_padding"] = padding.numpy()
        outs = [self.attention(self.spec.name, q_seq, k_seq, v, params=self.spec.params, **options)
                for v in v_blocks]
        return torch.cat(outs, dim=-1)[:, 0, -1, :self.n]


def capacity_loss(y_hat, target_values, n):
    """Schlag's loss: 0.5 * ||onehot(v) - y||^2 summed over the N values, mean over the batch (0.5 when
    nothing is retrieved)."""
    target = F.one_hot(target_values - n, n).to(y_hat.dtype)
    return 0.5 * (target - y_hat).pow(2).sum(dim=-1).mean()
