"""Running sums of weighted outcomes and what they estimate: the sufficient statistics of
``streams.control.offpolicy``'s estimators (the formulas are in its docstring), kept apart so
that the sums, their merge and the regression adjustment read on one screen each. Pure.
"""

from __future__ import annotations

import math

import msgspec

#: Scales s of the covariate x = log1p(extras / s) the regression adjustment chooses among
#: (`best_scale`). Where the value of extra candidates bends is not known in advance (the
#: demo's curve bends at 16), and a covariate of the wrong shape leaves a bias: at s = 1 on
#: a curve bending at 16 the SBM lift read -7% of the truth once the arms carried different
#: extras. The first scale's sums are ``wx``, ``wxx``, ``wxy``; the others' are ``wxs``.
SCALES: tuple[float, ...] = (1.0, 4.0, 16.0, 64.0, 256.0)


class Moments(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True,
              array_like=True):
    """Importance-weighted sums of one arm, w = 1/propensity (over the inclusion probability
    too for a sampled record: w = v/p, v = 1/inclusion), x_k = log1p(extras / SCALES[k])::

        n, Σw, Σw², Σwy, Σw²y, Σw²y²       (SNIPS mean and its delta-method variance)
        Σwx, Σwx², Σwxy, Σwy²               (the regression adjustment, x = x_0)
        (Σwx_k, Σwx_k², Σwx_ky) for k ≥ 1   (``wxs``: the other scales)

    ``mean`` = Σwy/Σw, ``mean_x`` = Σwx/Σw, ``sxx`` = Σw(x - mean_x)², ``sxy`` =
    Σw(x - mean_x)y, ``syy`` = Σw(y - mean)²; `at` gives them at another scale. The x sums
    came later; a snapshot without them reads as zeros (no covariate seen)."""

    n: float = 0.0
    w: float = 0.0
    w2: float = 0.0
    wy: float = 0.0
    w2y: float = 0.0
    w2y2: float = 0.0
    wx: float = 0.0
    wxx: float = 0.0
    wxy: float = 0.0
    wyy: float = 0.0
    wxs: tuple[float, ...] = ()

    def add(self, y: float, weight: float = 1.0, max_n: float = math.inf,
            extra: float = 0.0) -> Moments:
        """The sums with one more round; past ``max_n`` rounds every sum is first scaled by
        (max_n - 1)/n (drift scaling, see the module docstring).

        :param y: the round's value.
        :param weight: its importance weight, 1/propensity (1 for the lift's sums).
        :param max_n: the most rounds the sums keep.
        :param extra: its extra candidates, the covariate's argument.
        """
        sums = msgspec.structs.astuple(self)[:10]
        wxs = self.wxs
        if self.n + 1.0 > max_n:
            f = (max_n - 1.0) / self.n
            sums = tuple(v * f for v in sums)
            wxs = tuple(v * f for v in wxs)
        n, w, w2, wy, w2y, w2y2, wx, wxx, wxy, wyy = sums
        ww = weight * weight
        x = math.log1p(extra / SCALES[0])
        if extra or wxs:   # sums never given a covariate (the lift's) keep none
            wxs = wxs or (0.0,) * (3 * len(SCALES) - 3)
            more: list[float] = []
            for k, scale in enumerate(SCALES[1:]):
                xk = math.log1p(extra / scale)
                more += [wxs[3 * k] + weight * xk, wxs[3 * k + 1] + weight * xk * xk,
                         wxs[3 * k + 2] + weight * xk * y]
            wxs = tuple(more)
        return Moments(n=n + 1.0, w=w + weight, w2=w2 + ww, wy=wy + weight * y,
                       w2y=w2y + ww * y, w2y2=w2y2 + ww * y * y, wx=wx + weight * x,
                       wxx=wxx + weight * x * x, wxy=wxy + weight * x * y,
                       wyy=wyy + weight * y * y, wxs=wxs)

    def at(self, k: int) -> Moments:
        """These sums with the covariate at ``SCALES[k]`` in ``wx``, ``wxx``, ``wxy`` (zeros
        where a snapshot from before the other scales has none)."""
        if k == 0:
            return self
        part = self.wxs[3 * k - 3:3 * k] if self.wxs else (0.0, 0.0, 0.0)
        return msgspec.structs.replace(self, wx=part[0], wxx=part[1], wxy=part[2], wxs=())

    @property
    def mean_x(self) -> float:
        return self.wx / self.w if self.w > 0 else 0.0

    @property
    def sxx(self) -> float:
        """Weighted sum of squares of x about its mean."""
        return max(self.wxx - self.wx * self.mean_x, 0.0)

    @property
    def sxy(self) -> float:
        return self.wxy - self.wx * self.mean

    @property
    def syy(self) -> float:
        return max(self.wyy - self.wy * self.mean, 0.0)

    @property
    def mean(self) -> float:
        return self.wy / self.w if self.w > 0 else 0.0

    @property
    def var_of_mean(self) -> float:
        """Delta-method variance of the self-normalised mean::

            Var(μ) = Σw²(y - μ)² / (Σw)² · n/(n - 1)

        (for unit weights, the sample variance over n). Σw²(y - μ)² is expanded as
        Σw²y² - 2μΣw²y + μ²Σw², so the sums need no second pass."""
        if self.w <= 0 or self.n < 2:
            return math.inf
        mu = self.mean
        s = max(self.w2y2 - 2.0 * mu * self.w2y + mu * mu * self.w2, 0.0)
        return s / (self.w * self.w) * self.n / (self.n - 1.0)

    def shrunk_var_of_mean(self, prior_var: float, prior_weight: float) -> float:
        """Variance of the mean with the per-round noise shrunk toward a prior::

            n_eff = (Σw)² / Σw²                      (Kish's effective sample size)
            s²    = Σw²(y - μ)² / Σw²
            Var   = (n_eff s² + m σ²) / (n_eff + m) / n_eff

        so a handful of equal values does not make a certain estimate.

        :param prior_var: σ², the per-round noise assumed before any label.
        :param prior_weight: m, how many rounds that assumption is worth.
        """
        if self.w <= 0 or self.w2 <= 0:
            return math.inf
        n_eff = self.w * self.w / self.w2
        mu = self.mean
        s = max(self.w2y2 - 2.0 * mu * self.w2y + mu * mu * self.w2, 0.0) / self.w2
        noise = (n_eff * s + prior_weight * prior_var) / (n_eff + prior_weight)
        return noise / n_eff


class Estimate(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A measured quantity with its interval (``None`` bounds: not enough labels yet)."""

    measured: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    std: float | None = None


def estimate(mean: float, var: float, z: float) -> Estimate:
    if not (math.isfinite(mean) and math.isfinite(var)):
        return Estimate()
    std = math.sqrt(max(var, 0.0))
    return Estimate(measured=mean, ci_low=mean - z * std, ci_high=mean + z * std, std=std)


def adjusted_gain(baseline: Moments, powerful: Moments) -> tuple[float, float]:
    """Powerful minus baseline at equal extra candidates, and the variance the adjustment adds::

        beta = max(0, Sxy / Sxx)          Sxx, Sxy, Syy pooled within the arms (`Moments`)
        gain = (mu_p - mu_b) - beta (xbar_p - xbar_b)
        var  = (xbar_p - xbar_b)² (Syy - beta Sxy) / (n_eff Sxx),   n_eff = Σ_arms (Σw)²/Σw²

    (the raw difference and no added variance when Sxx is 0: no spread in x.)

    The arms do not get the same extras: a powerful request's are capped by its pool's
    allowance and the SBM target, a baseline one's by the RMA budget, and an extra candidate
    is worth as much as the model change. The raw difference credits the model with the
    extras' value (it read -0.05 for segments truly worth +0.02 and +0.05 in the demo). So
    this is the regression adjustment of experiments (ANCOVA; Lin 2013): value = arm + β·x,
    x = log1p(extras / s) (a concave curve, as `workers.policy.shed_order.marginal_extra_value`
    assumes; the caller picks s with `best_scale`, here x is whatever the sums hold), β
    pooled within the arms. β is kept ≥ 0: more candidates never lower the best
    score, and a negative slope is noise."""
    raw = powerful.mean - baseline.mean
    sxx = baseline.sxx + powerful.sxx
    if sxx <= 1e-9:
        return raw, 0.0
    sxy = baseline.sxy + powerful.sxy
    beta = max(sxy / sxx, 0.0)
    dx = powerful.mean_x - baseline.mean_x
    residual = max(baseline.syy + powerful.syy - beta * sxy, 0.0)
    n_eff = sum(m.w * m.w / m.w2 for m in (baseline, powerful) if m.w2 > 0)
    return raw - beta * dx, dx * dx * residual / (max(n_eff, 1.0) * sxx)


def sampled(treated: Moments) -> bool:
    """Whether any treated round carries a sampling weight above 1: Σv² > n exactly when
    some v > 1 (at full logging every v is 1, and Σv² = n to the bit)."""
    return treated.w2 > treated.n + 1e-9


def sbm_share_var(counted: list[tuple[float, float]], sbm: float, treated: Moments) -> float:
    """Delta-method variance of the SBM lift from estimating its shares from a sample::

        sbm = Σ_i v_i c_i / Σ_i v_i,   c_i = gain_s for a powerful round of s, else 0
        Var = Σ_i v_i² (c_i - sbm)² / (Σ v)²
            ≈ r (Σ_s P_s (gain_s - sbm)² + (Σ v - Σ_s P_s) sbm²) / (Σ v)²,   r = Σv² / Σv

    (Σ v² over a segment's powerful rounds taken as r P_s: exact when every treated round
    has one weight, as when a scope's clients share one sample rate).

    :param counted: (P_s, gain_s) of each segment counted in the SBM lift.
    :param sbm: the SBM lift.
    :param treated: the treated rounds' sums (Σ v in ``w``, Σ v² in ``w2``).
    """
    if treated.w <= 0:
        return 0.0
    powerful = sum(p for p, _ in counted)
    spread = sum(p * (g - sbm) ** 2 for p, g in counted) + max(treated.w - powerful, 0.0) * sbm ** 2
    return treated.w2 / treated.w * spread / (treated.w * treated.w)


def merge(a: Moments, b: Moments) -> Moments:
    sums = {f: getattr(a, f) + getattr(b, f) for f in Moments.__struct_fields__ if f != "wxs"}
    if not a.wxs or not b.wxs:
        wxs = a.wxs or b.wxs
    else:
        wxs = tuple(x + y for x, y in zip(a.wxs, b.wxs, strict=True))
    return Moments(**sums, wxs=wxs)


def residual(baseline: Moments, powerful: Moments) -> float:
    """What the within-arm regression leaves unexplained, Syy - Sxy²/Sxx (pooled over the
    arms; Syy when x does not vary): the smaller, the better the covariate's shape fits."""
    sxx = baseline.sxx + powerful.sxx
    syy = baseline.syy + powerful.syy
    if sxx <= 1e-9:
        return syy
    sxy = baseline.sxy + powerful.sxy
    return syy - max(sxy, 0.0) ** 2 / sxx


def best_scale(pairs: list[tuple[Moments, Moments]]) -> int:
    """The index in ``SCALES`` of the covariate that fits the outcomes best, summed over
    (baseline, powerful) pairs (the segments): least squares over the scales, the shape of
    the value curve learned from the data rather than assumed. Ties and no data: the first."""
    if not pairs:
        return 0
    scores = [sum(residual(b.at(k), p.at(k)) for b, p in pairs) for k in range(len(SCALES))]
    return min(range(len(SCALES)), key=lambda k: (scores[k], k))
