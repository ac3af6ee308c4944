"""FedEM: federated expectation-maximisation over a mixture of K shared models (Marfoq, Neglia,
Bellet, Kameni, Vidal, "Federated multi-task learning under a mixture of distributions",
NeurIPS 2021).

Every client's data is a mixture of K underlying distributions, each learned by one shared
model. Each round a sampled client computes, for each of its samples, the responsibility of
each model, q(z_i = k) proportional to pi_k * exp(-loss_k(x_i, y_i)) (E-step); its mixture
weights become pi_k = mean_i q(z_i = k); it then trains every model on its q-weighted loss
(M-step, the paper's local solver); the server averages each model by examples. A client
predicts with its pi-weighted mixture of the models' outputs (`fedflock.algorithms.mixture`).

Where this departs from the paper and the authors' code, and why:
- The paper keeps pi on the client; here pi travels up (K floats a round) so the server can
  report memberships and evaluate every client, sampled this round or not, and the server
  sends it back with the models. Held by the server it is in the run's checkpoint, so a
  resumed run continues exactly (state left on the clients would be lost on a resume).
- The K models start from K distinct seeded initialisations (the authors' code seeds each
  learner differently); with one shared start the E-step could not tell them apart.
- The local solver is the run's local SGD for `training.local_epochs` epochs on each model,
  with the q-weighted batch-mean loss (the authors run a fixed number of steps).
"""

from __future__ import annotations

from fedflock.algorithms.mixture import MixtureAlgorithm
from fedflock.algorithms.registry import ALGORITHMS


@ALGORITHMS.register("fedem", "FedEM (Marfoq et al.): every client a mixture of K shared "
                     "models, fitted by federated EM")
class FedEM(MixtureAlgorithm):
    name = "fedem"
