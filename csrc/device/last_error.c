/* The words of the calling thread's last device error (device.h). */
#include "vramguard/device.h"

static _Thread_local vg_device_error last_error;

vg_device_error *vg_device_last_error(void)
{
    return &last_error;
}
