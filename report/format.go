package report

import (
	"strconv"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/partita-dev/partita/gpu"
)

// gpus is milli-GPUs as a JSON number of GPUs; milli/1000 is exact enough
// for three decimals to print as written (0.25, not 0.2499999).
func gpus(milli int64) float64 {
	f, _ := strconv.ParseFloat(gpu.FormatMilli(milli), 64)
	return f
}

// FormatMiB writes MiB the way people read GPU memory: whole Gi when it is
// whole, one decimal of Gi from 1Gi up (79.6Gi), Mi below.
func FormatMiB(mib int64) string {
	switch {
	case mib == 0:
		return "0"
	case mib%1024 == 0:
		return strconv.FormatInt(mib/1024, 10) + "Gi"
	case mib >= 1024 || mib <= -1024:
		return strconv.FormatFloat(float64(mib)/1024, 'f', 1, 64) + "Gi"
	}
	return strconv.FormatInt(mib, 10) + "Mi"
}

// QuantityFloat is q as the float nearest its decimal value, to the
// micro-unit the admission loop writes usage in and beyond: 410.4, where
// AsApproximateFloat64 gives 410.40000000000003.
func QuantityFloat(q resource.Quantity) float64 {
	f, err := strconv.ParseFloat(q.AsDec().String(), 64)
	if err != nil {
		return q.AsApproximateFloat64()
	}
	return f
}

// quantityMilli is a GPU quantity in milli-GPUs.
func quantityMilli(q resource.Quantity) int64 { return q.MilliValue() }
