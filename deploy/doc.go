// Package deploy holds the tests of what operators deploy: the Helm chart
// (helm lint, helm template, and every rendered object decoded strictly into
// the Kubernetes API types), the manifests rendered from it, the systemd unit
// and the container image. It is a module of its own so that Helm and the
// Kubernetes API types stay out of the product's go.mod.
package deploy
