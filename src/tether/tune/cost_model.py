"""The cost model: gradient-boosted trees (scikit-learn's GradientBoostingRegressor) from a task's knob values to
log latency, refit on the task's measurements as they arrive. (Not HistGradientBoostingRegressor: on the tens to
hundreds of samples a task has, its OpenMP threads cost seconds per fit on a busy host, against milliseconds here.)

Failed configs (wrong result, crash, timeout, build error) are taught as twice the slowest latency seen, so the
explorer learns to stay away from their neighbourhood without a separate classifier. The model ranks candidates;
it never replaces a measurement.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from tether.tune.space import ConfigSpace

MIN_SAMPLES = 6            # below this the explorer samples at random


class CostModel:
    def __init__(self, space: ConfigSpace, seed: int = 0):
        self.space = space
        self.seed = seed
        self._model: Any = None

    @property
    def ready(self) -> bool:
        return self._model is not None

    def fit(self, configs: Sequence[Dict[str, Any]], latencies: Sequence[Optional[float]]) -> bool:
        """Fit on measured configs (latency None: the config failed). False when there is too little to learn."""
        ok = [lat for lat in latencies if lat is not None and lat > 0]
        if len(ok) < MIN_SAMPLES or len(set(ok)) < 2:
            return False
        from sklearn.ensemble import GradientBoostingRegressor

        worst = math.log(max(ok) * 2.0)
        X = np.array([self.space.features(c) for c in configs], dtype=np.float64)
        y = np.array([math.log(lat) if lat is not None and lat > 0 else worst for lat in latencies])
        model = GradientBoostingRegressor(n_estimators=60, learning_rate=0.15, max_depth=3, min_samples_leaf=2,
                                          random_state=self.seed)
        model.fit(X, y)
        self._model = model
        return True

    def predict(self, configs: Sequence[Dict[str, Any]]) -> np.ndarray:
        """Predicted log latency of each config (lower is better)."""
        if not configs:
            return np.zeros(0)
        X = np.array([self.space.features(c) for c in configs], dtype=np.float64)
        return self._model.predict(X)

    def rank(self, configs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        order = np.argsort(self.predict(configs), kind="stable")
        return [configs[i] for i in order]
