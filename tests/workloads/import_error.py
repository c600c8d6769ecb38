import torch  # noqa: F401
from a_module_that_does_not_exist import thing  # noqa: F401
