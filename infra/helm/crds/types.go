// Package crds pins the monitoring API module so `go mod download` fetches the Go types that
// controller-gen reads; nothing here is built into Surplus.
package crds

import _ "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
