from django.urls import path

from billing import views

urlpatterns = [path("costs/", views.costs, name="costs")]
