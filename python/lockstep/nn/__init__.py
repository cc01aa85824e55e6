"""lockstep.nn: Module (subclass it, as torch.nn.Module), layers, losses, functional, init."""

from .. import _lockstep as _C
from .._reexport import reexport as _reexport

_nn = _C.nn
_reexport(globals(), _nn)
# The package's functional and init (functional.py composes more), not the extension's copied above.
del functional, init  # noqa: F821
from . import functional, init, utils  # noqa: E402,F401
_Base = _nn.Module


class Parameter(_C.Tensor):
    """A tensor that a Module registers as a parameter when assigned as its attribute."""

    def __init__(self, data, requires_grad=True):
        super().__init__(data.detach())
        self.requires_grad_(requires_grad)


# Its operators as fast as lockstep.Tensor's (CPython gives a subclass the generic slots).
_C._install_fast_slots(Parameter)


class _Listed(list):
    """What parameters() returns: a list (len, indexing, as lockstep has always given) that is also
    an iterator, as torch's generator, for ``next(model.parameters())``."""

    def __next__(self):
        i = self.__dict__.get("_next", 0)
        if i >= len(self):
            raise StopIteration
        self._next = i + 1
        return self[i]


class Module(_Base):
    """Subclass it and define ``forward``. Attributes that are Parameters or modules register
    themselves (by the attribute's name, as torch's), so parameters(), named_parameters(),
    state_dict(), load_state_dict(), train()/eval(), apply(), optimizers, checkpoints and
    lockstep.dist.DataParallel see them."""

    def __init__(self):
        super().__init__()

    def __setattr__(self, name, value):
        if isinstance(value, Parameter):
            self._register_parameter(name, value)
        elif isinstance(value, _Base):
            self._register_module(name, value)
        elif isinstance(value, _C.Tensor) and name in self.__dict__:
            # A tensor in place of a registered parameter or buffer (another layer's weight:
            # weight tying) takes its place in the registry too, as in PyTorch.
            old = self.__dict__[name]
            if isinstance(old, Parameter) or self._registered(name, old):
                self._replace_tensor(name, value)
        object.__setattr__(self, name, value)

    def _registered(self, name, tensor):
        return any(t.is_same(tensor) for n, t in self.state_dict().items() if n == name)

    def _replace_tensor(self, name, value):
        try:
            self.set_parameter(name, value)
        except _C.Error:
            self.set_buffer(name, value)

    def parameters(self, recurse=True):
        return _Listed(super().parameters())

    def register_buffer(self, name, tensor):
        self._register_buffer(name, tensor)
        object.__setattr__(self, name, tensor)

    def register_parameter(self, name, param):
        self._register_parameter(name, param)
        object.__setattr__(self, name, param)

    def add_module(self, name, module):
        self._register_module(name, module)
        object.__setattr__(self, name, module)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(type(self).__name__ + " has no forward()")


class Sequential(_nn.Sequential):
    __doc__ = _nn.Sequential.__doc__

    def __init__(self, *layers):
        super().__init__(*layers)
        self._layers = list(layers)  # the Python objects live as long as the container

    def append(self, layer):
        self._layers.append(layer)
        return super().append(layer)


class ModuleList(_nn.ModuleList):
    __doc__ = _nn.ModuleList.__doc__

    def __init__(self, modules=None):
        modules = list(modules) if modules is not None else []
        super().__init__(modules)
        self._modules_kept = modules

    def append(self, module):
        self._modules_kept.append(module)
        return super().append(module)


class ModuleDict(_nn.ModuleDict):
    """Modules by name, in insertion order (torch.nn.ModuleDict); names are fixed once given."""

    def __init__(self, modules=None):
        super().__init__()
        self._modules_kept = {}  # the Python objects live as long as the container
        if modules is not None:
            self.update(modules)

    def __setitem__(self, name, module):
        self._insert(name, module)
        self._modules_kept[name] = module

    def __getitem__(self, name):
        if name not in self:
            raise KeyError(name)
        return self._modules_kept[name]

    def update(self, modules):
        for name, module in (modules.items() if hasattr(modules, "items") else modules):
            self[name] = module

    def __getattr__(self, name):  # self.transformer.wte, as torch's modules read their children
        kept = self.__dict__.get("_modules_kept", {})
        if name in kept:
            return kept[name]
        raise AttributeError("'ModuleDict' object has no attribute '%s'" % name)

    def __iter__(self):
        return iter(self.keys())

    def items(self):
        return [(name, self[name]) for name in self.keys()]

    def values(self):
        return [self[name] for name in self.keys()]


class CrossEntropyLoss(Module):
    def __init__(self, ignore_index=-100, reduction="mean", label_smoothing=0.0):
        super().__init__()
        self.ignore_index, self.reduction = ignore_index, reduction
        self.label_smoothing = label_smoothing

    def forward(self, input, target):
        return functional.cross_entropy(input, target, ignore_index=self.ignore_index,
                                        reduction=self.reduction,
                                        label_smoothing=self.label_smoothing)


class NLLLoss(Module):
    def __init__(self, ignore_index=-100, reduction="mean"):
        super().__init__()
        self.ignore_index, self.reduction = ignore_index, reduction

    def forward(self, input, target):
        return functional.nll_loss(input, target, ignore_index=self.ignore_index,
                                   reduction=self.reduction)


class MSELoss(Module):
    def __init__(self, reduction="mean"):
        super().__init__()
        self.reduction = reduction

    def forward(self, input, target):
        return functional.mse_loss(input, target, reduction=self.reduction)


class BCEWithLogitsLoss(Module):
    def __init__(self, reduction="mean"):
        super().__init__()
        self.reduction = reduction

    def forward(self, input, target):
        return functional.binary_cross_entropy_with_logits(input, target,
                                                           reduction=self.reduction)


class BCELoss(Module):
    def __init__(self, weight=None, reduction="mean"):
        super().__init__()
        self.weight, self.reduction = weight, reduction

    def forward(self, input, target):
        return functional.binary_cross_entropy(input, target, weight=self.weight,
                                               reduction=self.reduction)


class UpsamplingNearest2d(_nn.Upsample):
    """torch.nn.UpsamplingNearest2d: Upsample with mode 'nearest'."""

    def __init__(self, size=None, scale_factor=None):
        super().__init__(size=size, scale_factor=scale_factor, mode="nearest")


class UpsamplingBilinear2d(_nn.Upsample):
    """torch.nn.UpsamplingBilinear2d: Upsample with mode 'bilinear' and align_corners=True."""

    def __init__(self, size=None, scale_factor=None):
        super().__init__(size=size, scale_factor=scale_factor, mode="bilinear",
                         align_corners=True)


class Transformer(Module):
    """torch.nn.Transformer, as PyTorch writes it: an encoder and a decoder (each with its final
    LayerNorm, or the custom ones given), every parameter of rank > 1 xavier-uniform. A Python
    Module, so that a subclass adds or replaces children as PyTorch's does (the
    word_language_model's `TransformerModel(nn.Transformer)` puts a Linear in place of the
    decoder)."""

    def __init__(self, d_model=512, nhead=8, num_encoder_layers=6, num_decoder_layers=6,
                 dim_feedforward=2048, dropout=0.1, activation=functional.relu,
                 custom_encoder=None, custom_decoder=None, layer_norm_eps=1e-5,
                 batch_first=False, norm_first=False, bias=True, device=None, dtype=None):
        super().__init__()
        common = dict(dim_feedforward=dim_feedforward, dropout=dropout, activation=activation,
                      layer_norm_eps=layer_norm_eps, batch_first=batch_first,
                      norm_first=norm_first, bias=bias)
        if custom_encoder is not None:
            self.encoder = custom_encoder
        else:
            self.encoder = TransformerEncoder(
                TransformerEncoderLayer(d_model, nhead, **common), num_encoder_layers,  # noqa: F821
                LayerNorm(d_model, eps=layer_norm_eps, bias=bias))  # noqa: F821
        if custom_decoder is not None:
            self.decoder = custom_decoder
        else:
            self.decoder = TransformerDecoder(  # noqa: F821
                TransformerDecoderLayer(d_model, nhead, **common), num_decoder_layers,  # noqa: F821
                LayerNorm(d_model, eps=layer_norm_eps, bias=bias))  # noqa: F821
        for p in self.parameters():
            if p.dim() > 1:
                init.xavier_uniform_(p)
        self.d_model, self.nhead, self.batch_first = d_model, nhead, batch_first

    def forward(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None,
                src_key_padding_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, src_is_causal=None, tgt_is_causal=None,
                memory_is_causal=False):
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask,
                              is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask,
                            tgt_is_causal=tgt_is_causal, memory_is_causal=memory_is_causal)

    generate_square_subsequent_mask = staticmethod(_nn.Transformer.generate_square_subsequent_mask)


# The modules Python code subclasses with methods of PyTorch's that lockstep needs no work for.
def _flatten_parameters(self):
    """cuDNN's packing of an RNN's weights in PyTorch; lockstep's are one program already."""


for _rnn in (LSTM, GRU):  # noqa: F821 (from the extension)
    _rnn.flatten_parameters = _flatten_parameters


class RNN(Module):
    """torch.nn.RNN, the Elman network: h_t = act(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh) with
    act tanh or relu, num_layers stacked (dropout between them in training), one or two
    directions; PyTorch's arguments, parameter names (weight_ih_l0, ..._reverse) and uniform
    init. Composed of lockstep's ops: one matmul over all steps for the inputs, then one per step."""

    def __init__(self, input_size, hidden_size, num_layers=1, nonlinearity="tanh", bias=True,
                 batch_first=False, dropout=0.0, bidirectional=False, device=None, dtype=None):
        super().__init__()
        if nonlinearity not in ("tanh", "relu"):
            raise _C.Error("RNN: unknown nonlinearity '%s'; use 'tanh' or 'relu'" % nonlinearity)
        if num_layers < 1 or hidden_size < 1 or not 0.0 <= dropout <= 1.0:
            raise _C.Error("RNN: num_layers and hidden_size must be positive and dropout in [0, 1];"
                           " got %d, %d, %r" % (num_layers, hidden_size, dropout))
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.nonlinearity, self.bias, self.batch_first = nonlinearity, bias, batch_first
        self.dropout, self.bidirectional = float(dropout), bidirectional
        k = hidden_size ** -0.5
        for layer in range(num_layers):
            for suffix in self._suffixes(layer):
                n_in = input_size if layer == 0 else hidden_size * (2 if bidirectional else 1)
                shapes = [("weight_ih", (hidden_size, n_in)), ("weight_hh", (hidden_size,
                                                                             hidden_size))]
                if bias:
                    shapes += [("bias_ih", (hidden_size,)), ("bias_hh", (hidden_size,))]
                for name, shape in shapes:
                    setattr(self, name + suffix, Parameter(_C.rand(*shape) * (2 * k) - k))

    def _suffixes(self, layer):
        return ["_l%d" % layer] + (["_l%d_reverse" % layer] if self.bidirectional else [])

    def forward(self, input, hx=None):
        batched = input.dim() == 3
        if input.dim() not in (2, 3):
            raise _C.Error("RNN: expected a 2-d (unbatched) or 3-d input; got shape %s"
                           % (list(input.shape),))
        x = input if batched else input.unsqueeze(1)
        if self.batch_first and batched:
            x = x.transpose(0, 1)
        steps, n = x.shape[0], x.shape[1]
        directions = 2 if self.bidirectional else 1
        if hx is None:
            hx = _C.zeros(self.num_layers * directions, n, self.hidden_size)
        elif not batched:
            hx = hx.unsqueeze(1)
        act = _C.tanh if self.nonlinearity == "tanh" else _C.relu
        finals = []
        for layer in range(self.num_layers):
            outputs = []
            for d, suffix in enumerate(self._suffixes(layer)):
                w_ih, w_hh = getattr(self, "weight_ih" + suffix), getattr(self, "weight_hh" + suffix)
                xs = x @ w_ih.t()
                if self.bias:
                    xs = xs + getattr(self, "bias_ih" + suffix)
                h, ys = hx[layer * directions + d], [None] * steps
                for t in (range(steps - 1, -1, -1) if d else range(steps)):
                    hh = h @ w_hh.t()
                    if self.bias:
                        hh = hh + getattr(self, "bias_hh" + suffix)
                    h = act(xs[t] + hh)
                    ys[t] = h
                outputs.append(_C.stack(ys))
                finals.append(h)
            x = outputs[0] if directions == 1 else _C.cat(outputs, dim=2)
            if self.dropout > 0 and self.training and layer + 1 < self.num_layers:
                x = functional.dropout(x, self.dropout, training=True)
        h_n = _C.stack(finals)
        if self.batch_first and batched:
            x = x.transpose(0, 1)
        if not batched:
            return x.squeeze(1), h_n.squeeze(1)
        return x, h_n

    def flatten_parameters(self):
        """cuDNN's packing of the weights in PyTorch; nothing to do here."""
