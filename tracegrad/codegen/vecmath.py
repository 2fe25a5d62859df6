"""Branch-free transcendental math emitted as llvmlite IR that LLVM's loop vectoriser can widen.

LLVM never vectorises calls into libm, so every function here is straight-line scalar IR made
of arithmetic, integer bit tricks, `select` and intrinsics that have vector forms (fma, fabs,
floor, rint, copysign). Each dtype has its own polynomial degrees: float32 is short and fast,
float64 aims at a few ulp. Coefficients are Chebyshev fits made with mpmath (see
docs/vecmath.md for the script, measured errors and the ranges over which they hold).
"""

import llvmlite.ir as ir

MATH_OPS = frozenset(
    {"exp", "log", "log1p", "expm1", "sin", "cos", "tan", "tanh", "logistic", "erf", "pow"}
)

# Polynomials are lowest order first. EXP: exp(r) = 1 + r + r^2 P(r) on |r| <= ln2/2.
EXP_F32 = [0.5, 0.16666576266288757, 0.04166655242443085, 0.00836324691772461,
           0.001392626785673201]
EXP_F64 = [0.5, 0.1666666666666667, 0.04166666666666667, 0.00833333333332607,
           0.0013888888888883703, 0.00019841269875048905, 2.480158732571076e-05,
           2.755725511097889e-06, 2.755727343657049e-07, 2.510533724466521e-08,
           2.091477283224809e-09]
EXP_F64_LOW = [0.49999999999954664, 0.16666666666662547, 0.04166666678715188,
               0.00833333334428351, 0.001388883886493708, 0.00019841224376436,
               2.486803358817772e-05, 2.7617713281815833e-06]  # ~2^-43: float32 pow only
# LOG: log(1+f) = 2 atanh(s), s = f/(2+f); R(z) = z P(z) with z = s^2 (fdlibm's form).
LOG_F32 = [0.6666668653488159, 0.39988774061203003, 0.2958027720451355]
LOG_F64 = [0.666666666666667, 0.3999999999989931, 0.2857142862606338, 0.22222211120449298,
           0.1818289017031397, 0.15331686868638428, 0.14616878919029822]
LOG_F64_LOW = [0.6666666666737623, 0.39999998795791064, 0.2857175485162511,
               0.22191380789044335, 0.1936304304875125]  # float32 pow only
# Double-double log for float64 pow: 2 atanh(s) = 2s + (2/3) s^3 + s^5 U(s^2).
LOGU_F64 = [0.4, 0.2857142857142937, 0.22222222221655138, 0.18181818335562422,
            0.1538459494439715, 0.13334805679298412, 0.11706209953550312, 0.11723454509771844]
# sin(r) = r + r^3 S(r^2), cos(r) = 1 - r^2/2 + r^4 C(r^2), fitted on |r| <= TRIG_CLAMP.
SIN_F32 = [-0.1666666716337204, 0.008333331905305386, -0.0001983999682124704,
           2.7238454549660673e-06]
COS_F32 = [0.0416666641831398, -0.0013888258254155517, 2.4538474463042803e-05]
SIN_F64 = [-0.16666666666666666, 0.008333333333333331, -0.000198412698412641,
           2.7557319218602575e-06, -2.5052105981350752e-08, 1.6058492556729892e-10,
           -7.584436884170301e-13]
COS_F64 = [0.041666666666666664, -0.0013888888888887096, 2.4801587298318395e-05,
           -2.755731704403567e-07, 2.0876099692314926e-09, -1.1379338585298136e-11]
TRIG_CLAMP = 0.80
# erf: piece 0 is erf(x)/x - 1 in x^2 on [0, 1]; piece i > 0 is log(erfc(x)) + x^2 in
# (x - ERF_MIDS[i-1]) on [ERF_BOUNDS[i-1], ERF_BOUNDS[i]]. Beyond the last bound erf is 1.
ERF_F32 = [[0.12837916612625122, -0.3761262595653534, 0.11283594369888306,
            -0.02685421146452427, 0.005189087241888046, -0.000801686430349946,
            7.875874871388078e-05],
           [-1.134492039680481, -0.5088008642196655, 0.10735966265201569,
            -0.025822965428233147, 0.006006909534335136, -0.001266717561520636,
            0.00021469235070981085],
           [-1.708144187927246, -0.30719873309135437, 0.04350845515727997,
            -0.0076267048716545105, 0.0014026557328179479, -0.0002685744548216462,
            4.694707240560092e-05]]
ERF_BOUNDS_F32, ERF_MIDS_F32 = [1.0, 2.0, 3.92], [1.5, 2.96]
ERF_F64 = [[0.1283791670955126, -0.3761263890318375, 0.11283791670954879,
            -0.026866170645076792, 0.0052239776248180145, -0.000854832698083379,
            0.0001205533111164271, -1.4925595266831182e-05, 1.6461000484121368e-06,
            -1.6350312701054695e-07, 1.4659775274047436e-08, -1.1372848856791674e-09,
            5.957176147748911e-11],
           [-1.0691625510278964, -0.5368997282451956, 0.11763221456797313,
            -0.029032576704844923, 0.00684460446520494, -0.001426194267032742,
            0.00023403603447495338, -1.8285233987950684e-05, -5.9550464251712725e-06,
            3.5720527792883914e-06, -1.111447561898e-06, 2.27536134872436e-07,
            -1.947523422741824e-08],
           [-1.5118317694401986, -0.36723373583916485, 0.060389569012827986,
            -0.012009702985580219, 0.0024475166453656752, -0.00048308935756179384,
            8.89908724471177e-05, -1.4608453706639033e-05, 1.931569513597998e-06,
            -1.298853171235752e-07, -3.164612087635251e-08, 1.8853326687219656e-08,
            -5.395533287538938e-09],
           [-2.0912374512027316, -0.21414590836732816, 0.021980013643523203,
            -0.002890108906168165, 0.00041123554112987266, -6.004788718328715e-05,
            8.778635915875213e-06, -1.2659189412049648e-06, 1.7793687023503295e-07,
            -2.4046564728697773e-08, 3.092930499709775e-09, -3.822609917948173e-10,
            3.6734557248773786e-11]]
ERF_BOUNDS_F64, ERF_MIDS_F64 = [1.0, 1.75, 3.0, 5.92], [1.375, 2.375, 4.46]

# Cody-Waite splits. LN2_* hi parts have trailing zero bits so k * hi is exact.
LN2_F32 = (0.693145751953125, 1.428606765330187e-06)
LN2_F64 = (0.6931471806019545, -4.2009150726810846e-11)
TWO_THIRDS_DD = (0.6666666666666666, 3.700743415417188e-17)
PIO2_F32 = (1.5707963705062866, -4.371138828673793e-08, -1.7151245100058819e-15,
            1.056299898220315e-23)
PIO2_F64 = (1.5707963267948966, 6.123233995736766e-17, -1.4973849048591698e-33)
LOG2E, TWO_OVER_PI = 1.4426950408889634, 0.6366197723675814


class _Math:
    """Emits float ops of one dtype; holds the dtype's bit layout and constants."""

    def __init__(self, builder: ir.IRBuilder, ty: ir.Type):
        self.b, self.t = builder, ty
        self.f64 = isinstance(ty, ir.DoubleType)
        self.it = ir.IntType(64 if self.f64 else 32)
        self.mant, self.bias = (52, 1023) if self.f64 else (23, 127)
        self.min_normal = 2.0 ** (1 - self.bias)

    def c(self, v: float) -> ir.Constant:
        return ir.Constant(self.t, v)

    def ci(self, v: int) -> ir.Constant:
        return ir.Constant(self.it, v)

    def _intr(self, name: str, *args: ir.Value) -> ir.Value:
        fnty = ir.FunctionType(self.t, [self.t] * len(args))
        fn = self.b.module.declare_intrinsic(name, [self.t], fnty)
        return self.b.call(fn, list(args))

    # -- arithmetic; plain floats are turned into constants --
    def _v(self, x):
        return self.c(x) if isinstance(x, (int, float)) else x

    def add(self, a, b):
        return self.b.fadd(self._v(a), self._v(b))

    def sub(self, a, b):
        return self.b.fsub(self._v(a), self._v(b))

    def mul(self, a, b):
        return self.b.fmul(self._v(a), self._v(b))

    def div(self, a, b):
        return self.b.fdiv(self._v(a), self._v(b))

    def fma(self, a, b, c):
        return self._intr("llvm.fma", self._v(a), self._v(b), self._v(c))

    def neg(self, a):
        return self.b.fneg(a)

    def abs(self, a):
        return self._intr("llvm.fabs", a)

    def floor(self, a):
        return self._intr("llvm.floor", a)

    def rint(self, a):
        return self._intr("llvm.rint", a)

    def copysign(self, mag, sign):
        return self._intr("llvm.copysign", self._v(mag), sign)

    def cmp(self, op: str, a, b) -> ir.Value:  # ordered: false when either side is nan
        return self.b.fcmp_ordered(op, self._v(a), self._v(b))

    def isnan(self, a, b=None) -> ir.Value:
        return self.b.fcmp_unordered("uno", a, a if b is None else b)

    def sel(self, cond, a, b):
        return self.b.select(cond, self._v(a), self._v(b))

    def clamp(self, x, lo: float, hi: float):  # nan passes through
        return self.sel(self.cmp(">", x, hi), hi, self.sel(self.cmp("<", x, lo), lo, x))

    def horner(self, x, coeffs):
        acc = self._v(coeffs[-1])
        for k in reversed(coeffs[:-1]):
            acc = self.fma(acc, x, k)
        return acc

    def bits(self, x):
        return self.b.bitcast(x, self.it)

    def from_bits(self, i):
        return self.b.bitcast(i, self.t)

    def pow2(self, k):
        """2^k for integral float k with k + bias in [1, 2 * bias]; no float->int conversion,
        so nan/inf cannot make poison (the adds put k + bias in the low mantissa bits)."""
        magic = self.add(k, 1.5 * 2.0**self.mant + self.bias)
        return self.from_bits(self.b.shl(self.bits(magic), self.ci(self.mant)))

    def ldexp(self, p, k):
        """p * 2^k for |k| up to ~2 * bias, rounding once into the subnormal range."""
        k1 = self.floor(self.mul(k, 0.5))
        return self.mul(self.mul(p, self.pow2(k1)), self.pow2(self.sub(k, k1)))


# ---------------------------------------------------------------- exp family
def _exp_reduce(m: _Math, x):
    n = m.rint(m.mul(x, LOG2E))
    hi, lo = LN2_F64 if m.f64 else LN2_F32
    r = m.fma(m.neg(n), hi, x)  # exact: hi has trailing zeros and r is near-cancellation
    return n, m.fma(m.neg(n), lo, r)


def _exp(m: _Math, x, lo=None, coeffs=None):
    """exp(x + lo); lo is an optional tail below ulp(x) (used by pow)."""
    coeffs = coeffs or (EXP_F64 if m.f64 else EXP_F32)
    x = m.clamp(x, -746.0, 710.0) if m.f64 else m.clamp(x, -104.0, 89.0)
    n, r = _exp_reduce(m, x)
    if lo is not None:
        r = m.add(r, lo)
    p = m.add(m.fma(m.mul(r, r), m.horner(r, coeffs), r), 1.0)
    return m.ldexp(p, n)


def _expm1(m: _Math, x):
    # expm1(x) = 2 (2^(n-1) em + 2^(n-1) - 1/2) with em = expm1(r): exact for n = 0, no
    # cancellation otherwise, and the final doubling overflows to inf at the right place.
    xc = m.clamp(x, -60.0, 710.0) if m.f64 else m.clamp(x, -30.0, 89.0)
    n, r = _exp_reduce(m, xc)
    em = m.fma(m.mul(r, r), m.horner(r, EXP_F64 if m.f64 else EXP_F32), r)
    t = m.pow2(m.sub(n, 1.0))
    res = m.mul(m.fma(em, t, m.sub(t, 0.5)), 2.0)
    return m.sel(m.cmp("==", x, 0.0), x, res)  # keep -0


def _tanh(m: _Math, x):
    # Past the clamp tanh rounds to +-1; expm1 keeps small |x| accurate.
    big = 22.0 if m.f64 else 10.0
    ax = m.sel(m.cmp(">", m.abs(x), big), big, m.abs(x))
    t = _expm1(m, m.mul(ax, 2.0))
    return m.copysign(m.div(t, m.add(t, 2.0)), x)


def _logistic(m: _Math, x):
    # exp(-|x|) never overflows; x < 0 uses e/(1+e) so tiny results stay accurate.
    e = _exp(m, m.neg(m.abs(x)))
    return m.div(m.sel(m.cmp(">=", x, 0.0), 1.0, e), m.add(e, 1.0))


# ---------------------------------------------------------------- log family
def _log_reduce(m: _Math, x, subnormals: bool):
    """x = 2^k (1 + f) with 1 + f in [sqrt(1/2), sqrt(2)); k returned as a float."""
    kadj = m.c(0.0)
    if subnormals:
        shift = 54 if m.f64 else 25
        tiny = m.cmp("<", x, m.min_normal)
        x = m.sel(tiny, m.mul(x, 2.0**shift), x)
        kadj = m.sel(tiny, -float(shift), 0.0)
    one = 0x3FF0000000000000 if m.f64 else 0x3F800000
    sqrt_half = 0x3FE6A09E00000000 if m.f64 else 0x3F3504F3
    i = m.b.add(m.bits(x), m.ci(one - sqrt_half))
    # exponent field -> float without fptosi: (2^mant | e) - (2^mant + bias)
    e = m.b.lshr(i, m.ci(m.mant))
    big = m.from_bits(m.b.or_(m.bits(m.c(2.0**m.mant)), e))
    k = m.add(m.sub(big, 2.0**m.mant + m.bias), kadj)
    mant_mask = (1 << m.mant) - 1
    mbits = m.b.add(m.b.and_(i, m.ci(mant_mask)), m.ci(sqrt_half))
    return k, m.sub(m.from_bits(mbits), 1.0)


def _log_kernel(m: _Math, k, f, c, coeffs=None):
    """k ln2 + log(1 + f) + c, fdlibm's evaluation order; c is a small correction term."""
    coeffs = coeffs or (LOG_F64 if m.f64 else LOG_F32)
    hi, lo = LN2_F64 if m.f64 else LN2_F32
    s = m.div(f, m.add(f, 2.0))
    z = m.mul(s, s)
    big_r = m.mul(z, m.horner(z, coeffs))
    hfsq = m.mul(m.mul(f, f), 0.5)
    acc = m.add(m.mul(s, m.add(hfsq, big_r)), m.fma(k, lo, c))
    return m.fma(k, hi, m.add(m.sub(acc, hfsq), f))


def _log_specials(m: _Math, x, at, res):
    """Patch log-like results: at is the argument value where log hits 0 (0 or -1)."""
    res = m.sel(m.cmp("<", x, at), float("nan"), res)
    res = m.sel(m.cmp("==", x, at), float("-inf"), res)
    res = m.sel(m.cmp("==", x, float("inf")), float("inf"), res)
    return m.sel(m.isnan(x), x, res)


def _log(m: _Math, x):
    k, f = _log_reduce(m, x, subnormals=True)
    return _log_specials(m, x, 0.0, _log_kernel(m, k, f, m.c(0.0)))


def _log1p(m: _Math, x):
    u = m.add(x, 1.0)
    k, f = _log_reduce(m, u, subnormals=False)
    # c = log(1 + x) - log(u): the rounding error of 1 + x, recovered exactly (musl log1p).
    c = m.sel(m.cmp(">=", k, 2.0), m.sub(1.0, m.sub(u, x)), m.sub(x, m.sub(u, 1.0)))
    c = m.sel(m.cmp("<", k, float(m.mant + 2)), m.div(c, u), 0.0)
    res = _log_specials(m, x, -1.0, _log_kernel(m, k, f, c))
    return m.sel(m.cmp("==", x, 0.0), x, res)  # keep -0


# ---------------------------------------------------------------- trig
def _trig(m: _Math, x, which: str):
    # Cody-Waite: n * part is exact inside fma, so the first step is exact and the rest
    # round once each; accurate while n is an exact integer close to x * 2/pi (see docs).
    n = m.rint(m.mul(x, TWO_OVER_PI))
    r = x
    for part in PIO2_F64 if m.f64 else PIO2_F32:
        r = m.fma(m.neg(n), part, r)
    # Clamp keeps out-of-range arguments' garbage inside the fitted interval: |sin| <= 1.
    r = m.clamp(r, -TRIG_CLAMP, TRIG_CLAMP)
    q = m.sub(n, m.mul(m.floor(m.mul(n, 0.25)), 4.0))  # n mod 4 without float->int
    z = m.mul(r, r)
    sin_r = m.fma(m.mul(r, z), m.horner(z, SIN_F64 if m.f64 else SIN_F32), r)
    hz = m.mul(z, 0.5)
    w = m.sub(1.0, hz)
    cos_p = m.horner(z, COS_F64 if m.f64 else COS_F32)
    tail = m.fma(m.mul(z, z), cos_p, m.sub(m.sub(1.0, w), hz))  # fdlibm: recover 1 - hz
    cos_r = m.add(w, tail)
    odd = m.b.or_(m.cmp("==", q, 1.0), m.cmp("==", q, 3.0))
    if which == "sin":
        res = m.sel(odd, cos_r, sin_r)
        res = m.sel(m.cmp(">=", q, 2.0), m.neg(res), res)
    elif which == "cos":
        res = m.sel(odd, sin_r, cos_r)
        flip = m.b.or_(m.cmp("==", q, 1.0), m.cmp("==", q, 2.0))
        res = m.sel(flip, m.neg(res), res)
    else:
        res = m.div(m.sel(odd, cos_r, sin_r), m.sel(odd, m.neg(sin_r), cos_r))
    if which != "cos":
        res = m.sel(m.cmp("==", x, 0.0), x, res)  # keep -0
    return res


# ---------------------------------------------------------------- erf
def _erf(m: _Math, x):
    sets = ERF_F64 if m.f64 else ERF_F32
    bounds = ERF_BOUNDS_F64 if m.f64 else ERF_BOUNDS_F32
    mids = ERF_MIDS_F64 if m.f64 else ERF_MIDS_F32
    ax = m.abs(x)
    z = m.mul(ax, ax)
    inner = m.cmp("<", ax, 1.0)
    # Pick each lane's piece by selecting coefficients, then evaluate one polynomial.
    mid, coeffs = m.c(mids[0]), [m.c(v) for v in sets[1]]
    for i in range(2, len(sets)):
        piece = m.cmp(">=", ax, bounds[i - 1])
        mid = m.sel(piece, mids[i - 1], mid)
        coeffs = [m.sel(piece, v, cur) for v, cur in zip(sets[i], coeffs, strict=True)]
    coeffs = [m.sel(inner, v, cur) for v, cur in zip(sets[0], coeffs, strict=True)]
    p = m.horner(m.sel(inner, z, m.sub(ax, mid)), coeffs)
    near = m.fma(ax, p, ax)  # erf(x) = x + x P(x^2)
    far = m.sub(1.0, _exp(m, m.sub(p, z)))  # erfc(x) = exp(-x^2 + Q(x))
    res = m.sel(inner, near, far)
    res = m.sel(m.cmp(">=", ax, bounds[-1]), 1.0, res)
    return m.copysign(res, x)


# ---------------------------------------------------------------- pow
def _two_sum(m: _Math, a, b):
    s = m.add(a, b)
    bb = m.sub(s, a)
    return s, m.add(m.sub(a, m.sub(s, bb)), m.sub(b, bb))


def _log_dd(m: _Math, ax):
    """log(ax) as a double-double (hi, lo), relative error ~2^-68 (float64 pow)."""
    k, f = _log_reduce(m, ax, subnormals=True)
    mm = m.add(f, 1.0)
    dh = m.add(mm, 1.0)
    dl = m.sub(mm, m.sub(dh, 1.0))  # 1 + m = dh + dl exactly (fast two-sum)
    sh = m.div(f, dh)
    sl = m.div(m.fma(m.neg(sh), dl, m.fma(m.neg(sh), dh, f)), dh)
    s2h = m.mul(sh, sh)
    s2l = m.fma(m.mul(sh, 2.0), sl, m.fma(sh, sh, m.neg(s2h)))
    s3h = m.mul(s2h, sh)
    s3l = m.fma(s2l, sh, m.fma(s2h, sl, m.fma(s2h, sh, m.neg(s3h))))
    th, tl = TWO_THIRDS_DD
    ah = m.mul(s3h, th)
    al = m.fma(s3h, tl, m.fma(s3l, th, m.fma(s3h, th, m.neg(ah))))
    tail5 = m.mul(m.mul(s3h, s2h), m.horner(s2h, LOGU_F64))
    hi, lo = _two_sum(m, m.mul(sh, 2.0), ah)
    lo = m.add(lo, m.add(m.add(m.mul(sl, 2.0), al), tail5))
    kh = m.mul(k, LN2_F64[0])  # exact: trailing zeros
    kl = m.mul(k, LN2_F64[1])  # what ln2 - hi - lo leaves out is below 2^-85 k
    hi, lo2 = _two_sum(m, kh, hi)
    return hi, m.add(lo2, m.add(lo, kl))


def _pow_magnitude(m: _Math, ax, y):
    """|x|^y for finite positive ax; float32 goes through float64 with short polynomials."""
    if not m.f64:
        d = _Math(m.b, ir.DoubleType())
        axd, yd = m.b.fpext(ax, d.t), m.b.fpext(y, d.t)
        k, f = _log_reduce(d, axd, subnormals=False)
        t = d.mul(yd, _log_kernel(d, k, f, d.c(0.0), LOG_F64_LOW))
        return m.b.fptrunc(_exp(d, t, coeffs=EXP_F64_LOW), m.t)
    hi, lo = _log_dd(m, ax)
    ph = m.mul(y, hi)
    pl = m.fma(y, lo, m.fma(y, hi, m.neg(ph)))
    pl = m.sel(m.cmp("<", m.abs(ph), 1000.0), pl, 0.0)  # inf/overflowing ph: drop nan tail
    return _exp(m, ph, lo=pl)


def _pow(m: _Math, x, y):
    ax, ay = m.abs(x), m.abs(y)
    inf, b = float("inf"), m.b
    y_int = m.cmp("==", m.floor(y), y)  # true for +-inf, false for nan
    half = m.mul(y, 0.5)
    y_odd = b.and_(y_int, m.cmp("!=", m.floor(half), half))

    def signed(mag):
        return m.sel(y_odd, m.copysign(mag, x), mag)

    res = signed(_pow_magnitude(m, ax, y))
    # C99 / numpy special cases: zero or infinite base, infinite exponent.
    x0, xinf, yinf = m.cmp("==", ax, 0.0), m.cmp("==", ax, inf), m.cmp("==", ay, inf)
    to_zero = b.icmp_unsigned("==", m.cmp("<", ax, 1.0), m.cmp(">", y, 0.0))
    special = m.sel(to_zero, 0.0, inf)
    special = m.sel(xinf, m.sel(m.cmp("<", y, 0.0), 0.0, inf), special)
    special = m.sel(x0, m.sel(m.cmp("<", y, 0.0), inf, 0.0), special)
    res = m.sel(b.or_(b.or_(x0, xinf), yinf), signed(special), res)
    neg_finite = b.and_(m.cmp("<", x, 0.0), m.cmp("<", ax, inf))
    res = m.sel(b.and_(neg_finite, b.not_(y_int)), float("nan"), res)
    res = m.sel(m.isnan(x, y), float("nan"), res)
    one = b.or_(m.cmp("==", y, 0.0), m.cmp("==", x, 1.0))
    one = b.or_(one, b.and_(m.cmp("==", x, -1.0), yinf))
    return m.sel(one, 1.0, res)


_UNARY = {
    "exp": _exp,
    "log": _log,
    "log1p": _log1p,
    "expm1": _expm1,
    "sin": lambda m, x: _trig(m, x, "sin"),
    "cos": lambda m, x: _trig(m, x, "cos"),
    "tan": lambda m, x: _trig(m, x, "tan"),
    "tanh": _tanh,
    "logistic": _logistic,
    "erf": _erf,
}


def emit_math(builder: ir.IRBuilder, name: str, args: list[ir.Value]) -> ir.Value:
    """Emit branch-free IR computing `name(*args)` for scalar float/double args.

    The code uses no calls or branches, only intrinsics with vector forms, so when it sits
    in a loop body LLVM's loop vectoriser can widen it. Do not put `fast`/`reassoc` flags on
    it: the range reductions rely on exact IEEE rounding.
    """
    if name not in MATH_OPS:
        raise ValueError(f"emit_math: unknown function {name!r}; supported: {sorted(MATH_OPS)}")
    arity = 2 if name == "pow" else 1
    if len(args) != arity:
        raise ValueError(f"emit_math: {name} takes {arity} argument(s), got {len(args)}")
    ty = args[0].type
    if not isinstance(ty, (ir.FloatType, ir.DoubleType)) or any(a.type != ty for a in args):
        kinds = ", ".join(str(a.type) for a in args)
        raise TypeError(f"emit_math: {name} needs float or double arguments of one type, "
                        f"got ({kinds}); cast them first")
    m = _Math(builder, ty)
    if name == "pow":
        return _pow(m, args[0], args[1])
    return _UNARY[name](m, args[0])
