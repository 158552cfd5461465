"""A local kube-apiserver, kube-controller-manager and etcd on loopback, for end-to-end tests."""
