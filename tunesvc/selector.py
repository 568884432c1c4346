"""The selector's names at their first home: the model is :mod:`tunesvc.serving.selector` (what
the runtime reads), its fitting :mod:`tunesvc.tuning.selector_fit`, cross-measuring and the
held-out evaluation :mod:`tunesvc.tuning.selector_measure`.

Kept so that ``from tunesvc import selector`` (the CLI, benchmarks, scripts) still finds every
name; serving code imports :mod:`tunesvc.serving.selector`, which imports no tuning.
"""

from __future__ import annotations

from tunesvc.serving.selector import FORMAT as FORMAT
from tunesvc.serving.selector import NEIGHBOURS as NEIGHBOURS
from tunesvc.serving.selector import PROJECT_LINE as PROJECT_LINE
from tunesvc.serving.selector import REACH as REACH
from tunesvc.serving.selector import SOFTENING as SOFTENING
from tunesvc.serving.selector import Distance as Distance
from tunesvc.serving.selector import Selector as Selector
from tunesvc.serving.selector import neighbour_scores as neighbour_scores
from tunesvc.serving.selector import stored_selector as stored_selector
from tunesvc.serving.selector import to_float32 as to_float32
from tunesvc.tuning.selector_fit import MAX_DEPTH as MAX_DEPTH
from tunesvc.tuning.selector_fit import MIN_KEYS as MIN_KEYS
from tunesvc.tuning.selector_fit import MIN_KEYS_KEPT as MIN_KEYS_KEPT
from tunesvc.tuning.selector_fit import MODELS as MODELS
from tunesvc.tuning.selector_fit import NEAR_BEST as NEAR_BEST
from tunesvc.tuning.selector_fit import RUNNER_UP_KEYS as RUNNER_UP_KEYS
from tunesvc.tuning.selector_fit import UNKNOWN_SLOWDOWN as UNKNOWN_SLOWDOWN
from tunesvc.tuning.selector_fit import SelectorWorse as SelectorWorse
from tunesvc.tuning.selector_fit import TrainingSet as TrainingSet
from tunesvc.tuning.selector_fit import choose as choose
from tunesvc.tuning.selector_fit import distinct_candidates as distinct_candidates
from tunesvc.tuning.selector_fit import fit as fit
from tunesvc.tuning.selector_fit import fit_model as fit_model
from tunesvc.tuning.selector_fit import fit_neighbours as fit_neighbours
from tunesvc.tuning.selector_fit import fitted_models as fitted_models
from tunesvc.tuning.selector_fit import keep as keep
from tunesvc.tuning.selector_fit import leave_one_out as leave_one_out
from tunesvc.tuning.selector_fit import nearest_pick as nearest_pick
from tunesvc.tuning.selector_fit import projects as projects
from tunesvc.tuning.selector_fit import refit as refit
from tunesvc.tuning.selector_fit import refit_after_sweep as refit_after_sweep
from tunesvc.tuning.selector_fit import runner_up_configs as runner_up_configs
from tunesvc.tuning.selector_fit import runner_ups as runner_ups
from tunesvc.tuning.selector_fit import targets as targets
from tunesvc.tuning.selector_fit import training_set as training_set
from tunesvc.tuning.selector_fit import tuned_winners as tuned_winners
from tunesvc.tuning.selector_fit import untuned_answer as untuned_answer
from tunesvc.tuning.selector_measure import CROSS_MEASURE as CROSS_MEASURE
from tunesvc.tuning.selector_measure import CROSS_RETIME as CROSS_RETIME
from tunesvc.tuning.selector_measure import CSV_COLUMNS as CSV_COLUMNS
from tunesvc.tuning.selector_measure import ROUNDS as ROUNDS
from tunesvc.tuning.selector_measure import WITHIN as WITHIN
from tunesvc.tuning.selector_measure import HeldOut as HeldOut
from tunesvc.tuning.selector_measure import append_csv as append_csv
from tunesvc.tuning.selector_measure import check_csv_path as check_csv_path
from tunesvc.tuning.selector_measure import cross_measure as cross_measure
from tunesvc.tuning.selector_measure import evaluate as evaluate
from tunesvc.tuning.selector_measure import summary as summary
