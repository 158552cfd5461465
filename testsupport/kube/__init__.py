"""A local kube-apiserver, kube-controller-manager and etcd on loopback, for the end-to-end tests and the benchmarks."""
