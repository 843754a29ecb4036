# fc6 of vgg16/8 (Linear 3136 -> 512 + ReLU) at microbatch 64, F + B, one thread: alone,
# then while a second process runs the same (as the pipeline's other device thread does).
import torch, time, sys, multiprocessing as mp
torch.set_num_threads(1)
def work(n, out=None):
    torch.set_num_threads(1)
    lin = torch.nn.Linear(3136, 512)
    x = torch.randn(64, 3136, requires_grad=True)
    g = torch.randn(64, 512)
    ts = []
    for i in range(n):
        t0 = time.perf_counter()
        y = torch.relu(lin(x)); y.backward(g)
        ts.append(time.perf_counter() - t0)
    ts.sort()
    if out is not None: out.put(ts[len(ts)//2])
    return ts[len(ts)//2]
def spin(stop):
    torch.set_num_threads(1)
    a = torch.randn(512, 512)
    while not stop.is_set(): a @ a
if __name__ == '__main__':
    print('alone      median F+B %.2f ms' % (work(200) * 1e3))
    stop = mp.Event(); p = mp.Process(target=spin, args=(stop,)); p.start(); time.sleep(0.5)
    print('beside a matmul loop  %.2f ms' % (work(200) * 1e3))
    stop.set(); p.join()
    q = mp.Queue(); p = mp.Process(target=work, args=(200, q)); p.start()
    print('beside its twin       %.2f ms' % (work(200) * 1e3)); p.join(); print('twin %.2f ms' % (q.get()*1e3))
    print('alone again           %.2f ms' % (work(200) * 1e3))
