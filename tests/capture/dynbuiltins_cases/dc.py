"""Programs for test_dynbuiltins_programs.py: dataclasses, enum and math."""
import dataclasses, enum, math, torch
from dataclasses import dataclass, field
X = lambda: (torch.ones(3),)

@dataclass(frozen=True)
class _F:
    a: int
    b: float = 2.0
@dataclass
class _D:
    x: torch.Tensor
    tags: list = field(default_factory=list)
    n: int = 0
    def __post_init__(self):
        self.n = len(self.tags) + 1
@dataclass(order=True)
class _O:
    k: int
    v: int = 0
class _Color(enum.Enum):
    RED = 1
    GREEN = 2
class _Lvl(enum.IntEnum):
    LOW = 1
    HIGH = 5
class _Perm(enum.Flag):
    R = 1
    W = 2
    X = 4

def dc_frozen(x):
    f = _F(3)
    return x * f.a * f.b, f == _F(3, 2.0), hash(f) == hash(_F(3))
def dc_frozen_setattr(x):
    f = _F(1)
    try:
        f.a = 2
    except dataclasses.FrozenInstanceError as e:
        return x, type(e).__name__
def dc_factory(x):
    d = _D(x)
    d.tags.append(1)
    e = _D(x, [1, 2])
    return d.n, e.n, d.tags, len(_D(x).tags)
def dc_replace(x):
    f = dataclasses.replace(_F(1), b=5.0)
    return f.b * x, f
def dc_asdict(x):
    d = _D(x, [1])
    return dataclasses.asdict(d)
def dc_eq(x):
    return _D(x) == _D(x), x
def dc_order(x):
    return _O(1) < _O(2), _O(1, 5) > _O(1, 3), sorted([_O(3), _O(1)])[0].k, x
def dc_fields(x):
    return [f.name for f in dataclasses.fields(_D)], x
def dc_astuple(x):
    return dataclasses.astuple(_F(1, 3.0)), x
def dc_local(x):
    @dataclass
    class L:
        a: int = 1
    return L().a * x
def enum_key(x):
    d = {_Color.RED: x, _Color.GREEN: x + 1}
    return d[_Color.GREEN]
def enum_cmp(x):
    c = _Color.RED
    if c is _Color.RED and c == _Color.RED and c != _Color.GREEN:
        return x + c.value, c.name
    return x
def enum_iter(x):
    return [m.name for m in _Color], len(_Color), x
def enum_lookup(x):
    return _Color(2), _Color["RED"], x
def intenum_arith(x):
    return x * _Lvl.HIGH, _Lvl.LOW < 3, _Lvl.HIGH + 1, int(_Lvl.LOW)
def flag_ops(x):
    p = _Perm.R | _Perm.W
    return _Perm.R in p, _Perm.X in p, bool(p & _Perm.X), p.value, x
def enum_arg(c, x):
    if c == _Color.GREEN:
        return x + 1
    return x - 1
def enum_isinstance(x):
    return isinstance(_Color.RED, _Color), isinstance(_Lvl.LOW, int), x
def math_floor_ceil(x):
    return x * math.floor(2.7), math.ceil(2.1), math.floor(-1.5), math.trunc(-2.5)
def math_sqrt(x):
    return x * math.sqrt(16), math.sqrt(2)
def math_prod(x):
    return math.prod([1, 2, 3]), math.prod([2.0, 0.5], start=3), x * math.prod(x.shape)
def math_isclose(x):
    return math.isclose(0.1 + 0.2, 0.3), math.isclose(1.0, 1.1, rel_tol=0.2), x
def math_inf_nan(x):
    return math.isinf(math.inf), math.isnan(math.nan), x.clamp(max=math.inf), -math.inf < 0, math.isfinite(1.0)
def math_log(x):
    return math.log(8, 2), math.log(10), math.log2(1024), math.log10(1000), x * math.log(4)
def math_misc(x):
    return math.gcd(12, 18), math.lcm(4, 6), math.factorial(5), math.comb(5, 2), math.perm(4, 2), math.pi * 2, x
def math_pow_exp(x):
    return math.pow(2, 10), math.exp(0), math.fabs(-3), math.copysign(2, -1), math.hypot(3, 4), x
def math_shape(x):
    return x.reshape(math.isqrt(9) // 3, -1) * math.sqrt(x.shape[0])
def math_floor_div_shape(x):
    return x[: math.ceil(x.shape[0] / 2)]
def math_fsum(x):
    return math.fsum([0.1] * 10), math.dist((0, 0), (3, 4)), x
def math_degrees(x):
    return math.degrees(math.pi), math.radians(180), math.sin(0), math.cos(0), math.atan2(1, 1), x
def math_modf(x):
    return math.modf(2.5), math.frexp(8.0), math.ldexp(1, 3), math.fmod(7, 3), math.remainder(7, 3), x

PROGS = [(n, f, X) for n, f in list(globals().items()) if callable(f) and not isinstance(f, type) and getattr(f, "__module__", "") == __name__ and not n.startswith("_") and n not in ("X", "enum_arg")]
PROGS.append(("enum_arg", enum_arg, lambda: (_Color.GREEN, torch.ones(3))))
