"""The tasks' data, generated in the process from a seed (nothing is downloaded).

- Associative-retrieval capacity (Schlag, Irie & Schmidhuber 2021, section 6.1; ischlag/fast-weight-transformers
  `synthetic/associativeRetrievalDataset.py`): N keys (ids 0..N-1) and N values (ids N..2N-1). Setting 1:
  a sequence of the N keys in random order (drawn without replacement), each with a distinct random value,
  and one query key drawn from the sequence; setting 2 (his `--replace`): 2N keys and values drawn with
  replacement, the query's last occurrence holds the answer. Evaluation as his `get_all_queries`: a fresh
  sequence, queried at every distinct key's last occurrence (at most 200), drawn with N tokens in both
  settings as his code does.
- MQAR (Arora et al. 2023, Zoology; HazyResearch/zoology `zoology/data/multiquery_ar.py`) with
  random_non_queries=False and one pass: keys from 1..V/2-1 and values from V/2..V-1, each without replacement
  within an example; the context k1 v1 ... kn vn, then each key once more at a query slot 2*gap after it,
  gaps drawn without replacement with p(gap = i) ~ a * i^(a-1), i = 1..(L - 2n)/2, a = 0.01; filler 0;
  labels -100 except at each query key's position, whose label is its value (the next-token target).

Both draw from a numpy RandomState in the order the published code draws from numpy's global generator, so
one seed gives the published code's sequences (Schlag: one generator for training batches and evaluations,
in the order they are asked for; Zoology: every example's keys, then every example's values, then every
example's gaps).
"""
import numpy as np

# Schlag's evaluation: 20 sequences per evaluation, each asked at most 200 queries.
CAPACITY_EVAL_SEQUENCES = 20
CAPACITY_EVAL_MAX_QUERIES = 200
MQAR_IGNORE = -100  # labels of the positions that are not queries (cross_entropy's ignore_index)


class CapacityTask:
    """Schlag's DataLoader: batch(size) for training, eval_sets() for one evaluation. All draws come from
    the RandomState given, in the order of the calls."""

    def __init__(self, n, setting, rng):
        if setting not in (1, 2):
            raise ValueError(f"setting must be 1 or 2, got {setting}")
        self.n, self.setting, self.rng = n, setting, rng
        self.replace = setting == 2
        self.seq_len = 2 * n if self.replace else n

    def batch(self, size):
        """(keys [size, S], values [size, S], query [size], target [size]): int64 arrays."""
        keys, values, query, target = [], [], [], []
        for _ in range(size):
            k = self.rng.choice(self.n, size=self.seq_len, replace=self.replace)
            v = self.n + self.rng.choice(self.n, size=self.seq_len, replace=self.replace)
            at = np.where(k == self.rng.choice(k))[0][-1]  # the last occurrence of the query key
            keys.append(k)
            values.append(v)
            query.append(k[at])
            target.append(v[at])
        return np.array(keys), np.array(values), np.array(query), np.array(target)

    def eval_sequence(self):
        """One evaluation sequence with every distinct key as a query (at most 200): (keys, values, query,
        target) with the sequence repeated once per query."""
        k = self.rng.choice(self.n, size=self.n, replace=self.replace)
        v = self.n + self.rng.choice(self.n, size=self.n, replace=self.replace)
        at = [np.where(k == key)[0][-1] for key in np.unique(k)][:CAPACITY_EVAL_MAX_QUERIES]
        count = len(at)
        return np.tile(k, (count, 1)), np.tile(v, (count, 1)), k[at], v[at]


def mqar(vocab, examples, seq_len, kv_pairs, seed, power_a=0.01):
    """(inputs, labels), int64 [examples, seq_len]: Zoology's multiquery_ar(vocab_size=vocab,
    num_examples=examples, input_seq_len=seq_len, seed=seed, power_a=power_a, num_kv_pairs=kv_pairs,
    num_passes=1, random_non_queries=False)."""
    check_mqar_sizes(vocab, seq_len, kv_pairs)
    rng = np.random.RandomState(seed)
    context = 2 * kv_pairs
    key_choices = np.arange(1, vocab // 2)
    value_choices = np.arange(vocab // 2, vocab)
    keys = np.stack([rng.choice(key_choices, size=kv_pairs, replace=False) for _ in range(examples)])
    values = np.stack([rng.choice(value_choices, size=kv_pairs, replace=False) for _ in range(examples)])
    space = (seq_len - context) // 2
    p = power_a * np.arange(1, space + 1) ** (power_a - 1)
    p = p / p.sum()
    gaps = np.stack([rng.choice(np.arange(space), size=kv_pairs, replace=False, p=p) for _ in range(examples)])

    sequence = np.zeros((examples, seq_len + 1), dtype=np.int64)
    sequence[:, 0:context:2] = keys
    sequence[:, 1:context:2] = values
    np.put_along_axis(sequence, context + 2 * gaps, keys, axis=1)
    labels = np.full((examples, seq_len + 1), MQAR_IGNORE, dtype=np.int64)
    np.put_along_axis(labels, context + 2 * gaps + 1, values, axis=1)
    # Next-token targets: position t's label is token t + 1's value slot.
    return sequence[:, :-1], labels[:, 1:]


def check_mqar_sizes(vocab, seq_len, kv_pairs):
    """Zoology's conditions on the sizes, as ValueError naming the one that fails."""
    if seq_len % 2:
        raise ValueError(f"seq_len {seq_len} must be even")
    if vocab <= seq_len:
        raise ValueError(f"vocab {vocab} must exceed seq_len {seq_len}")
    if 4 * kv_pairs > seq_len:
        raise ValueError(f"kv_pairs {kv_pairs}: 2 * kv_pairs (context) + 2 * kv_pairs (query slots) must fit "
                         f"seq_len {seq_len}")
    if kv_pairs > vocab // 2 - 1:
        raise ValueError(f"kv_pairs {kv_pairs} exceeds the {vocab // 2 - 1} keys of vocab {vocab}")


def leaked(train_inputs, test_inputs):
    """How many test sequences also occur in the training set (Zoology warns about the same)."""
    seen = {row.tobytes() for row in train_inputs}
    return sum(row.tobytes() in seen for row in test_inputs)
