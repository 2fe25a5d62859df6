"""PyTorch's autograd tutorial ("Automatic differentiation with torch.autograd"), ported line
by line to tracegrad: `torch.` became `tg.`, and it prints what PyTorch prints.

Run: python examples/autograd_tutorial.py
"""
import tracegrad as tg

tg.manual_seed(0)

# A one-layer network: input x, parameters w and b, and a loss.
x = tg.ones(5)  # input tensor
y = tg.zeros(3)  # expected output
w = tg.randn(5, 3, requires_grad=True)
b = tg.randn(3, requires_grad=True)
z = tg.matmul(x, w)+b
loss = tg.nn.functional.binary_cross_entropy_with_logits(z, y)

# Tensors, functions and the computational graph: grad_fn is the entry point into the graph.
print(f"Gradient function for z = {z.grad_fn}")
print(f"Gradient function for loss = {loss.grad_fn}")

# Computing gradients: d loss / d w and d loss / d b.
loss.backward()
print(w.grad)
print(b.grad)

# Disabling gradient tracking.
z = tg.matmul(x, w)+b
print(z.requires_grad)

with tg.no_grad():
    z = tg.matmul(x, w)+b
print(z.requires_grad)

# The same with detach().
z = tg.matmul(x, w)+b
z_det = z.detach()
print(z_det.requires_grad)

# Optional reading: tensor gradients and Jacobian products. For a non-scalar output,
# backward(v) computes v^T J, and gradients accumulate across calls.
inp = tg.eye(4, 5, requires_grad=True)
out = (inp+1).pow(2).t()
out.backward(tg.ones_like(out), retain_graph=True)
print(f"First call\n{inp.grad}")
out.backward(tg.ones_like(out), retain_graph=True)
print(f"\nSecond call\n{inp.grad}")
inp.grad.zero_()
out.backward(tg.ones_like(out), retain_graph=True)
print(f"\nCall after zeroing gradients\n{inp.grad}")
