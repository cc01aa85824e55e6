"""The binding offers what the C++ API offers: every public function declared in
include/lockstep/ops.h and nn.h (namespaces lockstep, lockstep::nn, lockstep::nn::init) and every
module class of nn.h is bound in Python, or listed in NOT_BOUND with the reason. The headers are
parsed here, so a function added in C++ fails this test until it is bound or listed."""
import os
import re

import lockstep
from conftest import SOURCE_DIR

HEADERS = ("include/lockstep/ops.h", "include/lockstep/nn.h")

# C++ names that Python spells as torch does ("Tensor.to" is lockstep.Tensor.to).
RENAMED = {
    "cast": "Tensor.to",  # x.to(lockstep.float64), and .float(), .long(), ... as torch's
    "index": "Tensor.__getitem__",  # x[0, ..., None, 1:3]
    "getitem": "Tensor.__getitem__",  # x[mask], x[:, idx], x[[0, 2]]
    "slice": "Tensor.__getitem__",  # x[:, start:end:step]
    "log_sigmoid": "nn.functional.logsigmoid",
    "BatchNorm": "nn.BatchNorm2d",  # torch has no nn.BatchNorm; BatchNorm1d is the same class
}

# Declared in C++, deliberately not bound: name -> why.
NOT_BOUND = {
    # Host data enters Python's lockstep through tensor(), from_numpy() and from_dlpack().
    "from_vector": "a C++ template over std::vector; Python passes lists or NumPy arrays",
    "from_blob": "a raw host pointer; Python passes buffers through from_numpy or DLPack",
    # Gradients of ops, recorded by backward(); torch keeps them out of its public namespace.
    "conv2d_backward_input": "conv2d's input gradient, recorded by backward()",
    "conv2d_backward_weight": "conv2d's weight gradient, recorded by backward()",
    "max_pool2d_backward": "max_pool2d's gradient, recorded by backward()",
    "avg_pool2d_backward": "avg_pool2d's gradient, recorded by backward()",
    "lstm_layer_backward": "lstm_layer's gradient, recorded by backward()",
    # torch has no public one-layer LSTM function either: nn.LSTM records it.
    "lstm_layer": "one layer and direction of nn.LSTM, which records it (torch: _VF.lstm)",
    "gru_layer_backward": "gru_layer's gradient, recorded by backward()",
    "gru_layer": "one layer and direction of nn.GRU, which records it (torch: _VF.gru)",
    "RNNBase": "the abstract base of LSTM and GRU, never made itself",
}


def _strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def _preprocess(text):
    """Removes preprocessor lines; returns the text and the names that function-declaring macros
    declare at their uses (LOCKSTEP_BINARY_DECL(add) declares add)."""
    text = re.sub(r"\\\n", " ", text)
    macros = {}  # name -> index of the parameter it declares a function by
    for m in re.finditer(r"^\s*#\s*define\s+(\w+)\(([^)]*)\)(.*)$", text, flags=re.M):
        params = [p.strip() for p in m.group(2).split(",")]
        for d in re.finditer(r"(\w+)\s+(\w+)\s*\(", m.group(3)):
            if d.group(2) in params and d.group(1) not in ("return", "operator"):
                macros[m.group(1)] = params.index(d.group(2))
    text = re.sub(r"^\s*#[^\n]*$", "", text, flags=re.M)
    declared = []
    for name, index in macros.items():
        for use in re.finditer(r"\b%s\s*\(([^()]*)\)" % name, text):
            declared.append([a.strip() for a in use.group(1).split(",")][index])
        text = re.sub(r"\b%s\s*\([^()]*\)" % name, "", text)
    return text, declared


_FUNCTION = re.compile(
    r"^(?:template\s*<[^;{]*?>\s*)?(?:(?:inline|static|constexpr|\[\[\w+\]\])\s+)*"
    r"[\w:<>,&*\s]+?[\s&*>](\w+)\s*\(")
_CLASS = re.compile(r"^(?:template\s*<.*>\s*)?(?:class|struct)\s+(\w+)(?:\s+final)?\s*(?::(.*))?$",
                    flags=re.S)
_KEYWORDS = {"return", "operator", "using", "typedef", "enum", "class", "struct", "namespace"}


def declarations(path):
    """(namespace, name) of the free functions, and {class: bases} of the classes, declared at
    namespace scope in a header; `using A = B;` aliases count as classes with base B."""
    text, macro_names = _preprocess(_strip_comments(open(path).read()))
    functions, classes = set(), {}
    scopes = []  # ("namespace", "lockstep::nn") or ("other", "")
    chunk, parens = [], 0

    def namespace():
        return scopes[-1][1] if scopes and scopes[-1][0] == "namespace" else None

    for ch in text:
        if ch in "()":
            parens += 1 if ch == "(" else -1
        if parens > 0 or ch not in "{};":
            chunk.append(ch)
            continue
        statement = " ".join("".join(chunk).split())
        chunk = []
        ns = namespace()
        if ch == "}":
            scopes.pop()
            continue
        if ns is not None:
            for name in macro_names:
                functions.add((ns, name))
            macro_names = []
            f = _FUNCTION.match(statement)
            c = _CLASS.match(statement)
            alias = re.match(r"^using\s+(\w+)\s*=\s*(\w+)$", statement)
            if c and ch == "{":
                bases = re.findall(r"(?:public|private|protected)?\s*([\w:]+)", c.group(2) or "")
                classes[c.group(1)] = [b.split("::")[-1] for b in bases if b]
            elif alias:
                classes[alias.group(1)] = [alias.group(2)]
            elif f and f.group(1) not in _KEYWORDS and not statement.startswith(("using", "enum")):
                functions.add((ns, f.group(1)))
        if ch == "{":
            m = re.match(r"^namespace\s+([\w:]+)$", statement)
            if m:
                outer = ns + "::" if ns else ""
                scopes.append(("namespace", outer + m.group(1)))
            else:
                scopes.append(("other", ""))
    return functions, classes


def _resolve(dotted):
    obj = lockstep
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _places(namespace):
    if namespace == "lockstep":
        return ("", "Tensor.", "nn.functional.")
    if namespace == "lockstep::nn":
        return ("nn.functional.", "nn.", "")
    if namespace == "lockstep::nn::init":
        return ("nn.init.",)
    raise AssertionError("a namespace this test does not map: " + namespace)


def cxx_api():
    """{name: where Python should have it}, for every function and module class of the headers."""
    wanted = {}
    classes = {}
    for header in HEADERS:
        functions, found = declarations(os.path.join(SOURCE_DIR, header))
        classes.update(found)
        for namespace, name in functions:
            wanted.setdefault(name, _places(namespace))
    modules = {"Module"}
    grew = True
    while grew:  # the classes derived from Module, directly or not
        grew = False
        for name, bases in classes.items():
            if name not in modules and any(b in modules for b in bases):
                modules.add(name)
                grew = True
    for name in modules:
        wanted[name] = ("nn.",)
    return wanted


def test_the_headers_are_parsed():
    # A parser that finds nothing would let every name through: check it sees what is there.
    api = cxx_api()
    for name in ("zeros", "add", "floor_divide", "clamp_min", "clone", "from_vector", "topk",
                 "max_pool2d_with_indices", "generator_state", "cross_entropy", "pad_sequences",
                 "kaiming_uniform_", "calculate_gain", "Linear", "BatchNorm1d", "LSTM",
                 "ModuleDict", "RNNBase"):
        assert name in api, name
    assert "operator" not in api and "Conv2dSpec" not in api and "ValuesIndices" not in api
    assert len(api) > 150, len(api)


def test_every_cxx_function_and_module_is_bound_in_python():
    missing = []
    for name, places in sorted(cxx_api().items()):
        if name in NOT_BOUND:
            continue
        if name in RENAMED:
            found = _resolve(RENAMED[name]) is not None
        else:
            found = any(_resolve(place + name) is not None for place in places)
        if not found:
            missing.append("%s (looked for lockstep.%s)" % (name, ", ".join(p + name for p in places)))
    assert not missing, ("declared in C++ but not bound in Python; bind them, or list them in "
                         "NOT_BOUND with the reason: " + "; ".join(missing))


def test_the_lists_name_only_what_they_must():
    api = cxx_api()
    for name in list(NOT_BOUND) + list(RENAMED):
        assert name in api, "%s is listed here but no longer declared in C++" % name
    for name in NOT_BOUND:
        assert not any(_resolve(p + name) is not None for p in api[name]), (
            "%s is bound now: take it off NOT_BOUND" % name)
