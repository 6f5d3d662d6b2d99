"""hvlite.keras: Horovod's ``horovod.keras`` under hvlite's name, so that ``import horovod.keras
as hvd`` becomes ``import hvlite.keras as hvd``.

Contract: the same module contents as ``hvlite.tensorflow.keras`` (Keras 3 on the TensorFlow
backend), which it is: Horovod's two Keras modules hold the same API, and Keras 3 is one package.
``hvlite.keras.callbacks`` and ``hvlite.keras.elastic`` import as submodules too.
"""
import sys

from ..tensorflow.keras import *  # noqa: F401,F403 - the API, named in __all__
from ..tensorflow.keras import __all__, callbacks, elastic  # noqa: F401

sys.modules[__name__ + ".callbacks"] = callbacks
sys.modules[__name__ + ".elastic"] = elastic
