PROVIDERS = ['met', 'noaa']
