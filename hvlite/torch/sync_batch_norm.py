"""``SyncBatchNorm``: batch normalization with statistics over every rank's batch.

Contract: in training mode (and with more than one rank) the forward pass normalizes with the
mean and variance of the combined batch of all ranks, and the backward pass gives every rank
the input gradient of that combined computation; weight and bias gradients stay per-rank sums
(the optimizer averages them, as for any parameter). Running statistics follow BatchNorm's
rules (unbiased variance, momentum or cumulative average). Each layer uses one allgather of
every rank's per-channel [mean, M2, count] forward (combined in float64; the activation is
worked on in float32, or float64 for float64 inputs) and one allreduce of [sum dy,
sum dy*xhat] backward, named after the order in which layers first synchronize
(``SyncBatchNorm.<i>``, fixed at a layer's first synchronized call, so they repeat every
step: response-cache hits). Every rank must run the same layers in the same order; layers a
rank only creates (a model only rank 0 builds, used in evaluation) take no number.
Evaluation mode is plain BatchNorm with running statistics; without them
(``track_running_stats=False``) it normalizes by the combined batch, as in training (as
BatchNorm and Horovod's SyncBatchNorm do).
"""
import itertools

import torch

from ..basics import size
from .ops import Sum, allgather_async, allreduce_async

__all__ = ["SyncBatchNorm"]

_layer_ids = itertools.count()


def _compute_dtype(dtype):
    """float32 for half-precision inputs, else the input's own (float32 or float64)."""
    return torch.promote_types(dtype, torch.float32)


def _normalized(x, mean, invstd, shape, dtype):
    """(x - mean) * invstd in ``dtype``, as one new tensor (in place after the subtraction)."""
    return (x.to(dtype) - mean.to(dtype).view(shape)).mul_(invstd.to(dtype).view(shape))


class _SyncBatchNormFn(torch.autograd.Function):
    """Works over the activation in float32 (float64 for float64 inputs): each rank's
    per-channel mean and M2 (sum of squared deviations) come from ``torch.var_mean``; only
    those, with the count, travel and are combined in float64 (Chan's parallel formula, which
    cancels no large sums), as are the two per-channel sums of backward. Nothing here waits
    for the device: the count is the host's, and only a local batch of at most one value per
    channel reads the combined count back. The input is saved for backward in its own dtype
    (the normalized values are remade there)."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, name):
        channels = x.shape[1]
        dims = [d for d in range(x.dim()) if d != 1]
        local_count = x.numel() // max(channels, 1)
        dtype = _compute_dtype(x.dtype)
        if local_count:
            var, mean = torch.var_mean(x.to(dtype), dim=dims, correction=0)
        else:                       # an empty local batch adds nothing
            var = mean = x.new_zeros(channels, dtype=dtype)
        local = torch.cat([mean.double(), var.double() * local_count,
                           mean.new_full((1,), float(local_count), dtype=torch.float64)])
        ranks = allgather_async(local.view(1, -1), name=name + ".stats").wait()
        counts = ranks[:, -1:]
        count = counts.sum()
        if local_count <= 1 and count.item() <= 1:      # else more than 1 value: no read back
            raise ValueError("SyncBatchNorm: expected more than 1 value per channel over all ranks "
                             "when training (got %d)" % int(count.item()))
        means = ranks[:, :channels]
        mean = (means * counts).sum(0) / count
        m2 = ranks[:, channels:2 * channels].sum(0) + (counts * (means - mean) ** 2).sum(0)
        var = m2 / count
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None:
            with torch.no_grad():
                unbiased = m2 / (count - 1).clamp_min(1)
                running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
                running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
        shape = [1, channels] + [1] * (x.dim() - 2)
        out = _normalized(x, mean, invstd, shape, dtype)
        if weight is not None:
            out.mul_(weight.to(dtype).view(shape)).add_(bias.to(dtype).view(shape))
        ctx.save_for_backward(x, mean, invstd, weight)
        ctx.count, ctx.name, ctx.dims, ctx.shape = count, name, dims, shape
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        x, mean, invstd, weight = ctx.saved_tensors
        dims, shape = ctx.dims, ctx.shape
        dtype = _compute_dtype(x.dtype)
        xhat = _normalized(x, mean, invstd, shape, dtype)
        g = grad.to(dtype)
        grad_weight = (g * xhat).sum(dim=dims).to(weight.dtype) if weight is not None else None
        grad_bias = g.sum(dim=dims).to(weight.dtype) if weight is not None else None
        gx = g * weight.to(dtype).view(shape) if weight is not None else g
        local = torch.cat([gx.sum(dim=dims), (gx * xhat).sum(dim=dims)]).double()
        total = allreduce_async(local, op=Sum, name=ctx.name + ".grad").wait()
        channels = invstd.numel()
        mean_dy = (total[:channels] / ctx.count).to(dtype).view(shape)
        mean_dy_xhat = (total[channels:] / ctx.count).to(dtype).view(shape)
        grad_x = (gx - mean_dy).sub_(xhat.mul_(mean_dy_xhat)).mul_(invstd.to(dtype).view(shape))
        return grad_x.to(grad.dtype), grad_weight, grad_bias, None, None, None, None, None


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """Drop-in for ``torch.nn.BatchNorm1d/2d/3d`` whose statistics span every rank.

    In training, the mean and variance are those of every rank's batch together (ranks may
    hold batches of different sizes), and the running statistics stay equal on every rank; in
    evaluation with running statistics, or with one rank, it is a plain batch norm (without
    running statistics, evaluation also uses every rank's batch, as BatchNorm uses its
    batch). Every rank must run the layer in the same order.

    Args:
        num_features, eps, momentum, affine, track_running_stats, device, dtype: as for
            ``torch.nn.BatchNorm2d``.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)
        self._hvl_name = None      # numbered at the first synchronized call (see the module)

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("expected at least 2D input (got %dD input)" % input.dim())

    def forward(self, input):
        """Normalize ``input`` (at least 2-D, channels in dimension 1): in training, or in
        evaluation with ``track_running_stats=False``, with more than one rank, by the
        statistics of every rank's batch (collective: every rank calls it, in the same order);
        otherwise as ``torch.nn.BatchNorm2d`` does.

        Raises:
            ValueError: ``input`` has fewer than 2 dimensions.
        """
        self._check_input_dim(input)
        # as BatchNorm: evaluation without running statistics normalizes by the batch's
        if (not self.training and self.track_running_stats) or size() == 1:
            return super().forward(input)
        momentum = self.momentum if self.momentum is not None else 0.0
        if self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:   # cumulative moving average
                momentum = 1.0 / float(self.num_batches_tracked)
        running = self.track_running_stats
        if self._hvl_name is None:
            self._hvl_name = "SyncBatchNorm.%d" % next(_layer_ids)
        return _SyncBatchNormFn.apply(input, self.weight, self.bias,
                                      self.running_mean if running else None,
                                      self.running_var if running else None,
                                      self.eps, momentum, self._hvl_name)

    @classmethod
    def convert_sync_batchnorm(cls, module):
        """A copy-free conversion of every BatchNorm layer of ``module`` into SyncBatchNorm."""
        converted = module
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and not isinstance(module, cls):
            converted = cls(module.num_features, module.eps, module.momentum, module.affine,
                            module.track_running_stats)
            if module.affine:
                converted.weight, converted.bias = module.weight, module.bias
            converted.running_mean, converted.running_var = module.running_mean, module.running_var
            converted.num_batches_tracked = module.num_batches_tracked
            converted.train(module.training)
        for name, child in module.named_children():
            converted.add_module(name, cls.convert_sync_batchnorm(child))
        return converted

